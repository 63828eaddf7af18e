"""Queued work by shape: what a placement pass and the queue-timeout sweep read.

A placement pass used to read every queued job in placement order and skip, one by
one, those whose requirements had already failed everywhere in the pass: its cost
grew with the queue (0.18 s with 1,000 queued, 4.5 s with 30,000). Here queued
jobs are kept in memory in *buckets*, one per placement shape (the requirements
``gangs.shape_key`` tells apart: resources, GPU model pattern, gang size) and
priority, each in submission order. Jobs of one bucket fit, or fail, on exactly
the same workers, so a pass only ever looks at the head of a bucket: it merges
the heads in placement order (priority, then submission) and, once a head fails,
drops its whole shape for the rest of the pass. A pass therefore costs
O(buckets + placed) whatever the queue length (docs/adr/0114).

Aging keeps its meaning: the head of a bucket is its oldest job (submission order
is creation order), so when a failed head has not waited ``aging_seconds`` no job
behind it in that bucket has either; when it has, it reserves the workers that
could ever run the shape, at its place in the order.

Queue timeouts are kept in a heap by deadline, so the sweep reads only the jobs
whose ``queue_timeout`` ran out. The index follows the store's queue
(:class:`~jupyter_ext.store.changes.QueuedJobs`, kept in step with the file on
every commit); a job is *pending* until :meth:`Core.settle_queue` has read its
spec and filed it in its bucket. Only the placement pass and the sweep read the
index, under the core's lock, so buckets are compacted there and never while a
pass walks them.
"""

import bisect
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpulayer.contracts import Resources

from .store.changes import QueuedJobs, QueuedRef

#: Dead entries a bucket may carry before it is compacted (besides as many as live).
_SLACK = 64


@dataclass(eq=False, slots=True)
class Entry:
    """A queued job filed in the index."""

    ref: QueuedRef
    #: Its placement shape (None: it is not placed by the pass, a cell of a session).
    key: str | None


@dataclass(eq=False)
class Bucket:
    """The queued jobs of one shape and priority, in submission order."""

    key: str
    priority: int
    #: The shape's requirements (the same for every job here).
    resources: Resources
    #: Whether its jobs are gangs (placed all nodes or none, ``gangs.py``).
    gang: bool
    seqs: list[int] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    live: int = 0


@dataclass(frozen=True, slots=True)
class Filing:
    """What :meth:`QueueIndex.file` needs to know of a job's spec."""

    key: str | None
    resources: Resources
    queue_timeout: float | None
    gang: bool = False


class QueueIndex:
    """Queued jobs by shape and by queue deadline (see the module docstring)."""

    def __init__(self, queued: QueuedJobs) -> None:
        self._pending: dict[str, QueuedRef] = {}
        self._live: dict[str, Entry] = {}
        self._buckets: dict[tuple[str, int], Bucket] = {}
        self._deadlines: list[tuple[float, int, Entry]] = []
        self._tiebreak = itertools.count()
        queued.subscribe(self._changed)

    def __len__(self) -> int:
        return len(self._pending) + len(self._live)

    def _changed(self, changes: list[tuple[str, QueuedRef | None]]) -> None:
        for job_id, ref in changes:
            self._pending.pop(job_id, None)
            old = self._live.pop(job_id, None)
            if old is not None and old.key is not None:
                self._buckets[(old.key, old.ref.priority)].live -= 1
            if ref is not None:
                self._pending[job_id] = ref

    # ------------------------------------------------------------- filing

    def pending(self) -> list[QueuedRef]:
        """Queued jobs not filed yet (their specs are to be read)."""
        return list(self._pending.values())

    def file(self, ref: QueuedRef, filing: Filing) -> None:
        """File a pending job (nothing if it left the queue or changed meanwhile)."""
        if self._pending.get(ref.id) is not ref:
            return
        del self._pending[ref.id]
        entry = self._live[ref.id] = Entry(ref, filing.key)
        if filing.key is not None:
            b = self._bucket(filing, ref.priority)
            if not b.seqs or ref.seq > b.seqs[-1]:
                b.seqs.append(ref.seq)
                b.entries.append(entry)
            else:  # back in the queue (a retry): its place is by submission
                i = bisect.bisect_right(b.seqs, ref.seq)
                b.seqs.insert(i, ref.seq)
                b.entries.insert(i, entry)
            b.live += 1
        if filing.queue_timeout is not None:
            deadline = ref.updated_at + filing.queue_timeout
            heapq.heappush(self._deadlines, (deadline, next(self._tiebreak), entry))

    def file_new(self, job_id: str, filing: Filing) -> None:
        """File a job just submitted, without the lock: only when it goes at the end
        of its bucket (a walk in progress may meet it there, never miss or repeat
        one); otherwise it waits for the next :meth:`Core.settle_queue`."""
        ref = self._pending.get(job_id)
        if ref is None:
            return
        b = self._buckets.get((filing.key, ref.priority)) if filing.key is not None else None
        if b is None or not b.seqs or ref.seq > b.seqs[-1]:
            self.file(ref, filing)

    def _bucket(self, filing: Filing, priority: int) -> Bucket:
        assert filing.key is not None
        b = self._buckets.get((filing.key, priority))
        if b is None:
            b = self._buckets[(filing.key, priority)] = Bucket(
                filing.key, priority, filing.resources, filing.gang
            )
        return b

    def compact(self) -> None:
        """Drop left jobs from the buckets and empty buckets (no walk in progress)."""
        for k, b in list(self._buckets.items()):
            if b.live <= 0:
                del self._buckets[k]
            elif len(b.entries) > 2 * b.live + _SLACK:
                kept = [e for e in b.entries if self._live.get(e.ref.id) is e]
                b.entries = kept
                b.seqs = [e.ref.seq for e in kept]

    # ------------------------------------------------------------ reading

    def alive(self, entry: Entry) -> bool:
        """Whether ``entry``'s job is still queued (as filed)."""
        return self._live.get(entry.ref.id) is entry

    def buckets(self) -> int:
        """How many buckets hold queued jobs."""
        return sum(1 for b in self._buckets.values() if b.live > 0)

    def walk(self) -> "Walk":
        """The filed jobs in placement order, bucket heads first (see :class:`Walk`)."""
        return Walk(self, [b for b in self._buckets.values() if b.live > 0])

    def sample(self, per_bucket: int) -> list[str]:
        """Ids of queued jobs: at most ``per_bucket`` of each bucket (its oldest), then
        at most as many not filed yet. What the autoscaler reads for its demand, never
        the whole queue (it runs outside the lock, so this does not await)."""
        out: list[str] = []
        for b in self._buckets.values():
            taken = 0
            for e in b.entries:
                if taken >= per_bucket:
                    break
                if self.alive(e):
                    out.append(e.ref.id)
                    taken += 1
        out += list(itertools.islice(self._pending, per_bucket))
        return out

    def due(self, now: float) -> list[Entry]:
        """Filed jobs whose queue deadline is ``now`` or earlier, taken off the
        deadline heap (:meth:`defer` puts one back)."""
        out: list[Entry] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, entry = heapq.heappop(self._deadlines)
            if self.alive(entry):
                out.append(entry)
        return out

    def defer(self, entry: Entry, deadline: float) -> None:
        """Keep a due job on the deadline heap (it is still queued)."""
        if self.alive(entry):
            heapq.heappush(self._deadlines, (deadline, next(self._tiebreak), entry))


class Walk:
    """Queued jobs in placement order, one bucket at a time.

    Iterating yields the head of the bucket that comes first; a bucket goes on
    to its next job only when the caller calls :meth:`next_in_bucket` for the job
    just yielded (it was placed), so a bucket whose head did not fit costs nothing
    more. :attr:`bucket` is the bucket of the job just yielded.
    """

    def __init__(self, index: QueueIndex, buckets: list[Bucket]) -> None:
        self._index = index
        self._heap: list[tuple[int, int, int, Bucket, list[Entry], int]] = []
        self._tiebreak = itertools.count()
        self._advance = False
        self._at: tuple[list[Entry], int] = ([], 0)
        self.bucket: Bucket | None = None
        for b in buckets:
            self._push(b, b.entries, -1)

    def _push(self, b: Bucket, entries: list[Entry], after: int) -> None:
        for i in range(after + 1, len(entries)):
            e = entries[i]
            if self._index.alive(e):
                order = (-b.priority, e.ref.seq, next(self._tiebreak))
                heapq.heappush(self._heap, (*order, b, entries, i))
                return

    def __iter__(self) -> Iterator[Entry]:
        while self._heap:
            _, _, _, b, entries, i = heapq.heappop(self._heap)
            self.bucket, self._advance, self._at = b, False, (entries, i)
            yield entries[i]
            if self._advance:
                self._push(b, entries, i)

    def next_in_bucket(self) -> None:
        """Go on with the bucket of the job just yielded."""
        self._advance = True

    def ahead(self, n: int) -> list[str]:
        """The ids of the job just yielded and of up to ``n - 1`` queued after it in
        its bucket: the rows a pass that places them will read."""
        entries, i = self._at
        out: list[str] = []
        for e in itertools.islice(entries, i, None):
            if len(out) >= n:
                break
            if self._index.alive(e):
                out.append(e.ref.id)
        return out
