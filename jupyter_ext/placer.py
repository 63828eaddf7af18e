"""The placement pass and its explanation, over the pure fit rules in ``placement.py``.

Placement order: priority (high first), then submission order. A job that does not
fit yet does not block smaller ones behind it (backfill), until it has waited
``aging_seconds``: from then on the workers that could ever run it take no job
placed after it, so it cannot starve. Among workers that fit, the one with the
fewest active tasks wins, then the name, so the same state always gives the same
placement. :meth:`Placer.explain` says per worker why a job waits, and flags a
job no registered worker could ever run.

Cells of a running session are placed first (``Sessions.place_cells``): they run in
their session's slot and GPUs.
"""

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpulayer.contracts import JobSpec, JobState, Placement, Resources, WorkerState

from . import access, gangs
from .auth import Principal
from .core import Core, new_id
from .placement import (
    JobLabel,
    Usage,
    WorkerView,
    free_fit,
    job_label,
    placed_report,
    static_misfit,
    usage_by_worker,
    waiting_report,
)
from .queue import Entry, QueueIndex, Walk
from .sessions import Sessions
from .store import JobRecord, Statement
from .transitions import placed_on

log = logging.getLogger(__name__)


@dataclass
class _Pass:
    """The state of one placement pass (lock held)."""

    now: float
    workers: list[WorkerView]
    usage: dict[str, Usage]
    free_slots: int
    stmts: list[Statement] = field(default_factory=list)
    placed: list[tuple[str, str]] = field(default_factory=list)  # (job id, worker id)
    failed_shapes: set[str] = field(default_factory=set)
    reserved: set[str] = field(default_factory=set)  # workers held for a job that aged
    taken: set[str] = field(default_factory=set)  # jobs placed in this pass
    static: dict[str, list[WorkerView]] = field(default_factory=dict)  # by shape

    def able(self, key: str, res: Resources) -> list[WorkerView]:
        """The (ready) workers that could ever run shape ``key``, worked out once
        per pass: every job of a shape has the same answer."""
        able = self.static.get(key)
        if able is None:
            able = self.static[key] = [w for w in self.workers if static_misfit(res, w) is None]
        return able

    def take(self, job_id: str, worker_id: str, gpus: list[int]) -> None:
        """Count a task placed on ``worker_id`` in this pass."""
        self.taken.add(job_id)
        self.usage[worker_id].tasks += 1
        self.usage[worker_id].gpus.update(dict.fromkeys(gpus, job_id))
        self.placed.append((job_id, worker_id))
        self.free_slots -= 1


class Placer:
    """Places queued jobs and explains why the others wait."""

    def __init__(self, core: Core, sessions: Sessions) -> None:
        self._core = core
        self._sessions = sessions
        #: Called after a pass that left jobs queued (the autoscaler's wake-up).
        self.on_queued: Callable[[], None] | None = None

    async def schedule(self) -> int:
        """Place every queued job that fits; returns how many were placed.

        One pass in placement order over the queue index (``queue.py``): the
        head of each shape's bucket first, a bucket going on only while its jobs
        are placed, so a pass costs O(shapes + placed), not O(queued). The pass
        stops as soon as no worker has a free slot.
        """
        core = self._core
        if not len(core.queue):  # the usual case after a completion
            return 0
        async with core.lock:
            now = core.clock()
            stmts, cells = await self._sessions.place_cells(now)
            workers = [w for w in await core.fleet.views() if w.state == WorkerState.ready]
            usage = await self.usage()
            free = sum(max(0, w.slots - usage[w.id].tasks) for w in workers)
            p = _Pass(now, workers, usage, free, stmts, cells)
            if free > 0:  # a full cluster reads no queue at all
                await self._walk(p, await core.settle_queue())
            if p.stmts:
                await core.store.apply(p.stmts)
        for job_id, worker_id in p.placed:
            if worker_id:
                core.notify_worker(worker_id)
            core.notify_job(job_id)
        if self.on_queued is not None:
            self.on_queued()
        return len(p.placed)

    async def schedule_cells(self) -> int:
        """Place only the waiting cells of running sessions (a warm session's cell
        already has its worker, slot and GPUs): no pass over the queue. Returns how
        many were placed (or cancelled, their session gone)."""
        core = self._core
        async with core.lock:
            stmts, cells = await self._sessions.place_cells(core.clock())
            if stmts:
                await core.store.apply(stmts)
        for job_id, worker_id in cells:
            if worker_id:
                core.notify_worker(worker_id)
            core.notify_job(job_id)
        return len(cells)

    async def spot_at_submit(self, spec: JobSpec) -> tuple[WorkerView, list[int]] | None:
        """Where a job being submitted goes at once (lock held, the job not stored
        yet), when a pass right after its submit would put it there: nothing else is
        queued (so nothing comes before it and no aged job holds workers back), it
        is one task, and a worker has a free fit. Else None: it is queued and the
        pass after the submit places it (docs/adr/0133)."""
        core = self._core
        if len(core.queue) or gangs.is_gang(spec) or spec.in_session:
            return None
        now = core.clock()
        workers = [w for w in await core.fleet.views() if w.state == WorkerState.ready]
        usage = await self.usage()
        free = sum(max(0, w.slots - usage[w.id].tasks) for w in workers)
        if free <= 0:
            return None
        board = self._core.board
        p = _Pass(now, workers, usage, free)
        return self._spot(p, "", spec.resources, lambda w: board.time_left_fits(w.name, spec, now))

    async def _walk(self, p: _Pass, queue: QueueIndex) -> None:
        """Place what fits, bucket heads in placement order (lock held); a shape
        whose head does not fit is not tried again in this pass, and its head, if
        it has waited ``aging_seconds``, reserves the workers that could ever run it."""
        walk = queue.walk()
        rows: dict[str, JobRecord] = {}
        for entry in walk:
            if p.free_slots <= 0:
                break
            bucket = walk.bucket
            assert bucket is not None
            if bucket.key not in p.failed_shapes:
                placed = await self._head(p, walk, entry, rows)
                if placed is not False:  # placed, or it left the queue meanwhile
                    walk.next_in_bucket()
                    continue
                p.failed_shapes.add(bucket.key)
            if p.now - entry.ref.created_at > self._core.settings.aging_seconds:
                p.reserved.update(w.id for w in p.able(bucket.key, bucket.resources))

    async def _head(
        self, p: _Pass, walk: Walk, entry: Entry, rows: dict[str, JobRecord]
    ) -> bool | None:
        """Place the job ``entry``, the head of its bucket: True when placed, False
        when it (so its shape) fits nowhere now, None when it left the queue. A
        single-task job's fit is decided on its bucket's requirements before its
        row is read; the rows of the jobs the bucket may place are read at once."""
        bucket = walk.bucket
        assert bucket is not None
        spot = None if bucket.gang else self._spot(p, bucket.key, bucket.resources)
        if spot is None and not bucket.gang:
            return False
        job_id = entry.ref.id
        if job_id not in rows:
            ahead = walk.ahead(min(p.free_slots, 256))
            rows.update((r.id, r) for r in await self._core.store.jobs_by_ids(ahead))
        job = rows.pop(job_id, None)
        if job is None or job.state != JobState.queued or job_id in p.taken:
            return None
        if not self._core.queue.alive(entry):  # a row read ahead may be stale
            return None
        spec = self._core.spec(job)
        if spot is None:
            return await self._place_gang(p, job, spec)
        board = self._core.board  # no task on an allocation that ends before its timeout
        if not board.time_left_fits(spot[0].name, spec, p.now):
            spot = self._spot(
                p, bucket.key, bucket.resources, lambda w: board.time_left_fits(w.name, spec, p.now)
            )
            if spot is None:
                return False
        w, gpus = spot
        p.stmts += placed_on(p.now, job, new_id(), w.id, w.name, gpus)
        self._core.instruments.placement_latency.observe(max(0.0, p.now - job.updated_at))
        p.take(job.id, w.id, gpus)
        return True

    @staticmethod
    def _spot(
        p: _Pass, key: str, res: Resources, usable: Callable[[WorkerView], bool] | None = None
    ) -> tuple[WorkerView, list[int]] | None:
        """Where a task of shape ``key`` goes now: among the workers not reserved
        that fit (and are ``usable``), the one with the fewest active tasks, then by name."""
        for w in sorted(p.able(key, res), key=lambda w: (p.usage[w.id].tasks, w.name)):
            if w.id in p.reserved or (usable is not None and not usable(w)):
                continue
            gpus = free_fit(res, w, p.usage[w.id])
            if isinstance(gpus, list):
                return w, gpus
        return None

    async def _place_gang(self, p: _Pass, job: JobRecord, spec: JobSpec) -> bool:
        """Place every node of a gang on the workers not reserved, or none (never on an
        allocation that ends before the job's timeout)."""
        board = self._core.board
        candidates = [
            w
            for w in p.workers
            if w.id not in p.reserved and board.time_left_fits(w.name, spec, p.now)
        ]
        nodes = gangs.choose(spec, candidates, p.usage)
        if nodes is None or len(nodes) > p.free_slots:
            return False
        p.stmts += await self._gang(job, spec, nodes, p.now)
        for n in nodes:
            p.take(job.id, n.worker.id, n.gpus)
        return True

    async def _gang(
        self, job: JobRecord, spec: JobSpec, nodes: list[gangs.Node], now: float
    ) -> list[Statement]:
        """Statements that place every node of a gang (lock held)."""
        head = await self._core.fleet.get(nodes[0].worker.id)
        address = head.info.get("address") or head.hostname
        busy = gangs.busy_ports(await self._core.store.active_tasks())
        port = gangs.pick_port(address, busy, head.info.get("rendezvous_ports"))
        return gangs.place(now, job, spec, nodes, address, port, new_id)

    # ------------------------------------------------------------- explain

    async def explain(self, job: JobRecord, viewer: Principal | None = None) -> Placement:
        """Where a job runs, or per worker why it waits (``GET jobs/{id}/placement``)."""
        core = self._core
        if job.state != JobState.queued:
            names = await core.fleet.all_names()
            return placed_report(job.model(await core.store.tasks_of_job(job.id), names))
        report, behind = await self.queued_report(job, viewer)
        if behind:
            report = report.model_copy(update={"summary": f"{report.summary}; {behind}"})
        return report

    async def queued_report(
        self, job: JobRecord, viewer: Principal | None = None
    ) -> tuple[Placement, str | None]:
        """Per worker why a queued job waits, and how many queued jobs come before it
        (``behind N queued jobs``, or None). The reasons name only the jobs ``viewer``
        may see, and the queue is a count, never ids."""
        core = self._core
        spec = core.spec(job)
        views = await core.fleet.views()
        report = gangs.waiting(await self.waiting(spec.resources, job.id, views, viewer), spec)
        report = core.board.annotate(job.id, spec, report, core.clock())  # providers' word
        ahead = core.store.queued.ahead(job.priority, job.seq) if report.satisfiable else 0
        if not ahead:
            return report, None
        jobs = "job" if ahead == 1 else "jobs"
        return report, f"behind {ahead} queued {jobs} (higher priority or older)"

    async def never_placeable(self, jobs: list[JobRecord]) -> dict[str, str]:
        """Of ``jobs``, the queued ones no registered worker could ever run, each with
        why: the job list flags them as ``GET jobs/{id}`` does (one read of the fleet;
        what workers use now does not matter to *ever*)."""
        queued = [j for j in jobs if j.state == JobState.queued]
        if not queued:
            return {}
        views = await self._core.fleet.views()
        never = {}
        for job in queued:
            spec = self._core.spec(job)
            report = waiting_report(spec.resources, job.id, JobState.queued, views, {})
            report = gangs.waiting(report, spec)
            if not report.satisfiable:
                never[job.id] = report.summary
        return never

    async def why_waiting(self, job: JobRecord) -> str:
        """Why a queued job waits, in one line for its owner (the reason a job that
        ran out of queue time ends with): the per-worker reasons, naming only the
        owner's own jobs."""
        owner = Principal(name=job.owner, role="submitter")
        report, behind = await self.queued_report(job, owner)
        reasons = [f"{w.worker}: {w.reason}" for w in report.workers if not w.fits]
        if not report.satisfiable or not reasons:
            reasons.insert(0, report.summary)
        return "; ".join(reasons + ([behind] if behind else []))

    async def waiting(
        self,
        res: Resources,
        job_id: str,
        views: list[WorkerView],
        viewer: Principal | None = None,
    ) -> Placement:
        """Per worker, whether a queued job needing ``res`` fits now and why not."""
        usage = await self.usage() if views else {}
        label = await self._label(usage, viewer)
        return waiting_report(res, job_id, JobState.queued, views, usage, label)

    async def _label(self, usage: dict[str, Usage], viewer: Principal | None) -> JobLabel:
        """How reasons for ``viewer`` name the jobs holding GPUs: a submitter's own
        by id, other owners' not at all."""
        owner = access.owner_scope(viewer)
        if owner is None:
            return job_label
        holders = {j for u in usage.values() for j in u.gpus.values()}
        rows = await self._core.store.jobs_by_ids(sorted(holders))
        mine = {r.id for r in rows if r.owner == owner}
        return lambda job_id: job_label(job_id) if job_id in mine else None

    async def usage(self) -> dict[str, Usage]:
        """What every worker has committed to active tasks (cells of a session run in
        their session's slot and GPUs, so they are not counted)."""
        cells = self._sessions.open_cells
        active = [h for h in await self._core.store.holds() if h.job_id not in cells]
        return defaultdict(Usage, usage_by_worker(active))
