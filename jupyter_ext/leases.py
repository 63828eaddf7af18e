"""Leases and the sweep: silent workers, expired leases, idle sessions, restarts.

Running tasks whose lease runs out end ``lost`` (or are retried), except one whose
assignment never reached its live worker, which goes back to the queue
(``Workers.never_received``, docs/adr/0136); tasks placed on a
worker that went offline before picking them up go back to the queue (a gang's
node ends its gang instead). Jobs still queued after their ``queue_timeout`` end
``timed_out``, saying why they waited. Idle sessions are ended. After a control-plane
(re)start, :meth:`Leases.recover` gives every worker a lease to come back.
"""

import contextlib
import logging

from gpulayer.contracts import JobState, WorkerState
from gpulayer.errors import InvalidTransition

from .core import Core
from .jobs import Jobs
from .placer import Placer
from .sessions import Sessions
from .store import Statement, TaskRecord, WorkerRecord
from .transitions import queue_timed_out, unplaced
from .workers import NEVER_RECEIVED, Workers

log = logging.getLogger(__name__)


class Leases:
    """The periodic sweep and the start-up recovery."""

    def __init__(
        self, core: Core, sessions: Sessions, placer: Placer, jobs: Jobs, workers: Workers
    ) -> None:
        self._core = core
        self._sessions = sessions
        self._placer = placer
        self._jobs = jobs
        self._workers = workers

    async def recover(self) -> None:
        """After a control-plane (re)start: give workers a lease to come back,
        and re-arm cancel requests that were not delivered yet."""
        core = self._core
        await core.store.extend_all_leases(core.clock() + core.settings.lease_seconds)
        await self._workers.rearm_cancels()
        await self._sessions.recover()

    async def sweep(self) -> None:
        """Mark silent workers and end (or retry) tasks whose lease ran out."""
        core = self._core
        now = core.clock()
        for w in await core.store.list_workers():
            await self._mark_silent(w, now)
        async with core.lock:
            stmts, ended = await self._expire(now)
            if stmts:
                await core.store.apply(stmts)
        ended += await self._queue_timeouts(now)
        for job_id in ended:
            core.notify_job(job_id)
            await self._sessions.job_ended(job_id)
        for job_id, reason in await self._sessions.idle(now):
            log.info("session job %s: %s", job_id, reason)
            with contextlib.suppress(InvalidTransition):
                await self._jobs.cancel(job_id, by="gpulayer", reason=reason)
        if stmts:
            await self._placer.schedule()

    async def _queue_timeouts(self, now: float) -> list[str]:
        """End the jobs still queued after their ``queue_timeout`` (measured from when
        they last entered the queue); returns their ids. Only the jobs whose
        deadline passed are read (the queue index keeps them by deadline)."""
        core = self._core
        async with core.lock:
            queue = await core.settle_queue()
            due = queue.due(now)
        ended = []
        for entry in due:
            try:
                if await self._queue_timeout(entry.ref.id, now):
                    ended.append(entry.ref.id)
            finally:  # one that is still queued (a failure here) is due again next sweep
                core.queue.defer(entry, now)
        return ended

    async def _queue_timeout(self, job_id: str, now: float) -> bool:
        """End a job whose queue deadline passed, unless it left the queue; True
        when it ended."""
        core = self._core
        job = await core.store.get_job(job_id)
        if job is None or job.state != JobState.queued:
            return False
        limit = core.spec(job).queue_timeout
        if limit is None or now - job.updated_at < limit:
            return False
        why = await self._placer.why_waiting(job)
        async with core.lock:
            row = await core.store.get_job(job.id)
            if row is None or row.state != JobState.queued or row.updated_at != job.updated_at:
                return False  # placed (or cancelled) meanwhile
            await core.store.apply(queue_timed_out(now, row, limit, why))
        log.info("job %s: still queued after its queue timeout", job.id)
        return True

    async def _mark_silent(self, w: WorkerRecord, now: float) -> None:
        """Move a worker that stopped heartbeating to ``unhealthy``, then ``offline``."""
        s = self._core.settings
        silent = now - (w.last_heartbeat or w.registered_at)
        new = None
        if silent > s.lease_seconds and w.state != WorkerState.offline:
            new = WorkerState.offline
        elif silent > 3 * s.heartbeat_seconds and w.state in (
            WorkerState.ready,
            WorkerState.draining,
        ):
            new = WorkerState.unhealthy
        if new:
            await self._core.store.set_worker_state(w.id, new)
            log.info("worker %s is %s (silent %.1fs)", w.name, new.value, silent)

    async def _expire(self, now: float) -> tuple[list[Statement], list[str]]:
        """Statements for expired leases and tasks stranded on offline workers (lock
        held), and the jobs they end or re-queue."""
        core = self._core
        stmts: list[Statement] = []
        ended: list[str] = []
        workers = await core.store.list_workers()
        by_id = {w.id: w for w in workers}
        for t in await core.store.expired_leases(now):
            if t.node_rank is not None and t.job_id in ended:
                continue  # its gang ends once, with the first node
            if self._workers.never_received(t, by_id.get(t.worker_id or ""), now):
                stmts += unplaced(now, await core.job(t.job_id), t, NEVER_RECEIVED)
            else:
                why = "worker stopped renewing the lease"
                stmts += await core.finish(t, JobState.lost, None, why)
            ended.append(t.job_id)
        offline = {w.id for w in workers if w.state == WorkerState.offline}
        for t in await core.store.active_tasks():
            if t.state == JobState.scheduled and t.worker_id in offline:
                stmts += await self._stranded(t, ended)
                ended.append(t.job_id)
        return stmts, ended

    async def _stranded(self, t: TaskRecord, ended: list[str]) -> list[Statement]:
        """A task placed on a worker that went offline before starting it."""
        why = "its worker went offline before starting it"
        if t.node_rank is None:
            return unplaced(self._core.clock(), await self._core.job(t.job_id), t, why)
        if t.job_id in ended:
            return []
        return await self._core.finish(t, JobState.lost, None, why)
