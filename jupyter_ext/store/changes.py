"""What committed transactions changed, for the read models kept in memory.

What the control plane reads on its hot paths is followed in memory rather than
read from SQLite each time: which jobs are ``queued`` (placement, the
queue-timeout sweep, the per-owner queue quota), what the active tasks hold
(every placement: each submit that may be placed at once, each pass, each
explanation), whether a worker's registration or state changed (the fleet's
views) and which tokens changed (the token cache, docs/adr/0115). Temp
triggers (created on the connection at :meth:`~jupyter_ext.store.Store.open`,
not part of the schema, so no migration) call the SQL function ``gl_changed``
for every such row change, whatever wrote it. The calls are collected per
transaction on aiosqlite's thread (:class:`Journal`), kept only when the
transaction commits, and applied on the event loop right after the hand-off
that committed them, before that write returns to its caller: after
``await store.apply(...)`` the read models agree with the file.
"""

import bisect
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .records import Hold, gpu_indices

log = logging.getLogger(__name__)

#: Temp triggers calling ``gl_changed``: a job entering, leaving or re-entering the
#: queue, a task becoming active (``scheduled`` or ``running``), changing while
#: active or ending, a worker registered, renamed, re-registered, in another state
#: or forgotten (not a heartbeat that changes none of them), and any change of a
#: token row.
TRIGGERS = """
CREATE TEMP TRIGGER IF NOT EXISTS gl_job_inserted AFTER INSERT ON main.jobs
WHEN NEW.state = 'queued' BEGIN
    SELECT gl_changed('job', NEW.id, NEW.state, NEW.priority, NEW.seq, NEW.created_at,
                      NEW.updated_at, NEW.owner);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_job_state AFTER UPDATE OF state ON main.jobs
WHEN OLD.state = 'queued' OR NEW.state = 'queued' BEGIN
    SELECT gl_changed('job', NEW.id, NEW.state, NEW.priority, NEW.seq, NEW.created_at,
                      NEW.updated_at, NEW.owner);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_job_deleted AFTER DELETE ON main.jobs
WHEN OLD.state = 'queued' BEGIN
    SELECT gl_changed('job', OLD.id, NULL, OLD.priority, OLD.seq, OLD.created_at,
                      OLD.updated_at, OLD.owner);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_task_inserted AFTER INSERT ON main.tasks
WHEN NEW.state IN ('scheduled', 'running') BEGIN
    SELECT gl_changed('task', NEW.id, NEW.job_id, NEW.worker_id, NEW.gpu_indices, NEW.state);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_task_changed
AFTER UPDATE OF state, job_id, worker_id, gpu_indices ON main.tasks
WHEN OLD.state IN ('scheduled', 'running') OR NEW.state IN ('scheduled', 'running') BEGIN
    SELECT gl_changed('task', NEW.id, NEW.job_id, NEW.worker_id, NEW.gpu_indices,
                      CASE WHEN NEW.state IN ('scheduled', 'running') THEN NEW.state END);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_task_deleted AFTER DELETE ON main.tasks
WHEN OLD.state IN ('scheduled', 'running') BEGIN
    SELECT gl_changed('task', OLD.id, OLD.job_id, OLD.worker_id, OLD.gpu_indices, NULL);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_worker_inserted AFTER INSERT ON main.workers BEGIN
    SELECT gl_changed('worker', NEW.id);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_worker_changed AFTER UPDATE ON main.workers
WHEN OLD.state IS NOT NEW.state OR OLD.info IS NOT NEW.info
    OR OLD.name IS NOT NEW.name OR OLD.id IS NOT NEW.id BEGIN
    SELECT gl_changed('worker', NEW.id);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_worker_deleted AFTER DELETE ON main.workers BEGIN
    SELECT gl_changed('worker', OLD.id);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_token_updated AFTER UPDATE ON main.tokens BEGIN
    SELECT gl_changed('token', NEW.id,
                      NEW.revoked_at IS NOT NULL OR NEW.used_at IS NOT NULL);
END;
CREATE TEMP TRIGGER IF NOT EXISTS gl_token_deleted AFTER DELETE ON main.tokens BEGIN
    SELECT gl_changed('token', OLD.id, 1);
END;
"""


@dataclass(frozen=True, slots=True)
class QueuedRef:
    """A queued job as placement orders it (its spec is read when needed)."""

    id: str
    priority: int
    seq: int
    created_at: float
    #: When it (last) entered the queue: its queue timeout counts from here.
    updated_at: float
    owner: str


#: Queue changes in one commit from which :class:`QueuedJobs` sorts its order afresh.
_REBUILD_AT = 256

#: Called with the job ids whose queue membership changed, in commit order.
QueueListener = Callable[[list[tuple[str, QueuedRef | None]]], None]
#: Called with ``(token id, ended)`` for every token row a commit changed: ``ended``
#: when it is now revoked, used or deleted (else another column changed, a role).
TokenListener = Callable[[list[tuple[str, bool]]], None]


class QueuedJobs:
    """The ids of the queued jobs, kept in step with the file (see the module
    docstring), how many each owner has queued, and their placement order."""

    def __init__(self) -> None:
        self.refs: dict[str, QueuedRef] = {}
        self._owners: Counter[str] = Counter()
        #: ``(-priority, seq)`` of every queued job, sorted: placement order, so a
        #: job's place in the queue is a bisection, not a count over the queue.
        self._order: list[tuple[int, int]] = []
        self._listeners: list[QueueListener] = []

    def __len__(self) -> int:
        return len(self.refs)

    def count(self, owner: str) -> int:
        """How many jobs ``owner`` has queued."""
        return self._owners.get(owner, 0)

    def ahead(self, priority: int, seq: int) -> int:
        """How many queued jobs come before a job of ``priority`` submitted as
        ``seq`` in placement order (higher priority, or the same and older):
        O(log n), where a ``COUNT(*)`` read every one of them (benchmarks/burst.py)."""
        return bisect.bisect_left(self._order, (-priority, seq))

    def subscribe(self, listener: QueueListener) -> None:
        """Call ``listener`` with every later change; it is first called with
        every job queued now."""
        self._listeners.append(listener)
        listener([(i, r) for i, r in self.refs.items()])

    def apply(self, changes: list[tuple[str, QueuedRef | None]]) -> None:
        """Apply committed changes (``None``: the job left the queue)."""
        # A batch as large as the queue (the whole queue read at start): sort once
        # rather than insert one by one into the middle of the order.
        rebuild = len(changes) >= max(_REBUILD_AT, len(self._order))
        for job_id, ref in changes:
            old = self.refs.pop(job_id, None)
            if old is not None:
                self._owners[old.owner] -= 1
                if not self._owners[old.owner]:
                    del self._owners[old.owner]
                if not rebuild:
                    key = (-old.priority, old.seq)
                    i = bisect.bisect_left(self._order, key)
                    if i < len(self._order) and self._order[i] == key:
                        del self._order[i]
            if ref is not None:
                self.refs[job_id] = ref
                self._owners[ref.owner] += 1
                if not rebuild:
                    bisect.insort(self._order, (-ref.priority, ref.seq))
        if rebuild:
            self._order = sorted((-r.priority, r.seq) for r in self.refs.values())
        notify(self._listeners, changes)


#: A task whose hold changed: its id and what it holds now (None: it is not active).
HoldChange = tuple[str, Hold | None]


class ActiveHolds:
    """What every ``scheduled`` or ``running`` task holds (its job, worker and GPUs),
    by task id, kept in step with the file (see the module docstring): placement
    reads it without a query over the tasks (benchmarks/scheduler.py), and a
    worker's acquire knows without a query whether any of its tasks waits to start
    and whether a task it started at submit still runs."""

    def __init__(self) -> None:
        self.by_task: dict[str, Hold] = {}
        self._scheduled: Counter[str | None] = Counter()  # worker id -> tasks scheduled

    def apply(self, changes: list[HoldChange]) -> None:
        """Apply committed changes, in commit order."""
        for task_id, hold in changes:
            old = self.by_task.pop(task_id, None)
            if old is not None and old.scheduled:
                self._scheduled[old.worker_id] -= 1
                if not self._scheduled[old.worker_id]:
                    del self._scheduled[old.worker_id]
            if hold is not None:
                self.by_task[task_id] = hold
                if hold.scheduled:
                    self._scheduled[hold.worker_id] += 1

    def any_scheduled(self, worker_id: str) -> bool:
        """Whether a task placed on ``worker_id`` waits to be started."""
        return worker_id in self._scheduled

    def running(self, task_id: str) -> bool:
        """Whether ``task_id`` is ``running`` (started, not ended)."""
        hold = self.by_task.get(task_id)
        return hold is not None and not hold.scheduled


class Journal:
    """``gl_changed`` calls of the transaction in progress (on aiosqlite's thread)
    and of the committed ones not yet applied (taken on the event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[tuple[Any, ...]] = []
        self._done: list[tuple[Any, ...]] = []

    def record(self, *args: Any) -> None:
        """The SQL function ``gl_changed``."""
        self._open.append(args)

    def commit(self) -> None:
        """The transaction committed: keep its changes."""
        with self._lock:
            self._done += self._open
        self._open = []

    def rollback(self) -> None:
        """The transaction rolled back: forget its changes."""
        self._open = []

    def mark(self) -> int:
        """Where the transaction's changes stand now (for :meth:`rollback_to`)."""
        return len(self._open)

    def rollback_to(self, mark: int) -> None:
        """A savepoint rolled back: forget the changes made since ``mark``."""
        del self._open[mark:]

    def take(self) -> list[tuple[Any, ...]]:
        """The committed changes not taken yet, oldest first."""
        with self._lock:
            done, self._done = self._done, []
        return done


def notify(listeners: "list[Callable[[Any], None]]", changes: Any) -> None:
    """Call each listener with ``changes``; one that fails is logged, never raised:
    the transaction has committed, and its writer must not be told it failed."""
    for listener in listeners:
        try:
            listener(changes)
        except Exception:
            log.exception("a listener of committed changes failed")


@dataclass
class Changes:
    """One batch of committed changes, by read model."""

    jobs: list[tuple[str, QueuedRef | None]]
    tokens: list[tuple[str, bool]]
    holds: list[HoldChange]
    workers: set[str]


def split(calls: list[tuple[Any, ...]]) -> Changes:
    """Journal calls as queue, token, hold and worker changes."""
    jobs: list[tuple[str, QueuedRef | None]] = []
    tokens: list[tuple[str, bool]] = []
    holds: list[HoldChange] = []
    workers: set[str] = set()
    for kind, item_id, *rest in calls:
        if kind == "token":
            tokens.append((item_id, bool(rest[0])))
            continue
        if kind == "worker":
            workers.add(item_id)
            continue
        if kind == "task":
            job_id, worker_id, gpus, state = rest  # state: None once not active
            hold = (
                Hold(job_id, worker_id, gpu_indices(gpus), state == "scheduled") if state else None
            )
            holds.append((item_id, hold))
            continue
        state, priority, seq, created_at, updated_at, owner = rest
        ref = QueuedRef(item_id, priority, seq, created_at, updated_at, owner)
        jobs.append((item_id, ref if state == "queued" else None))
    return Changes(jobs, tokens, holds, workers)
