"""The worker service: register, heartbeat, acquire, drain, and the fleet's reads.

Worker states: ``ready`` (heartbeating) → ``unhealthy`` (missed three heartbeats)
→ ``offline`` (silent for a whole lease); a heartbeat brings it back (to ``ready``,
or to ``draining`` when it was drained: it finishes its tasks and takes no new
ones). The lease sweep (``leases.py``) moves workers down; this service brings
them back. Workers call out to the control plane, never the other way: an
acquire long poll hands them assignments, cancels and interrupts.

Each acquire answer that starts tasks has a ``seq`` that only grows (the
microseconds of the clock when they started, which is their ``started_at``);
workers echo the newest they took in (``acquired_seq``) in heartbeats and
registrations, so reconciliation ends a running task the worker does not list
only when the worker had seen the answer that carried it: a heartbeat built
before that answer arrived, however late it comes, loses nothing.

An answer can be lost on the way (the control plane killed after it stored the
start, a connection dropped mid-answer): the worker then takes later answers but
never the one that carried the task. A task counts as received (acknowledged) once
the worker listed it in a heartbeat or registration; a running task the worker
never acknowledged, does not list, and whose answer is older than the newest it
took in goes back to the queue as a fresh attempt (its task ends, so anything it
might still send is refused), instead of ending ``lost``; with no later answer, the
lease sweep asks :meth:`Workers.never_received` when the lease runs out
(docs/adr/0136). A worker whose channel or long poll broke does not leave it to
the lease: it asks for an answer at once (``acquire(..., resync=True)``, empty when
nothing waits) and heartbeats once it took it (docs/adr/0150).
"""

import logging
from collections.abc import Sequence

from pydantic import SecretStr

from gpulayer.contracts import (
    Acquired,
    Assignment,
    Heartbeat,
    HeartbeatReply,
    JobKind,
    JobSpec,
    JobState,
    Registered,
    Telemetry,
    Worker,
    WorkerRegistration,
    WorkerState,
)

from . import access, gangs
from .auth import Principal, TokenService
from .core import Core, new_id
from .placer import Placer
from .secrets import Secrets
from .store import JobRecord, Statement, TaskRecord, WorkerRecord
from .store.writes import append_system_line, delete_worker
from .streams import worker_key
from .transitions import Begin, started, unplaced

log = logging.getLogger(__name__)

#: Registration fields kept as the worker's ``info``.
_INFO = {"cpus", "memory_bytes", "devices", "labels", "slots", "version", "python", "address",
         "rendezvous_ports"}  # fmt: skip


class Workers:
    """Admit workers, hear their heartbeats, hand them work."""

    def __init__(self, core: Core, placer: Placer, tokens: TokenService, secrets: Secrets) -> None:
        self._core = core
        self._placer = placer
        self._tokens = tokens
        self._secrets = secrets
        self._last_seq = 0  # the newest Acquired.seq handed out
        # Per worker, its running tasks it listed at least once: it received them.
        self._acked: dict[str, set[str]] = {}

    async def all(self, viewer: Principal | None = None) -> list[Worker]:
        """Every known worker with its running tasks and latest readings (of the
        tasks ``viewer`` may see)."""
        workers = await self._core.fleet.workers()
        await access.scoped_workers(self._core.store, viewer, workers)
        return workers

    async def telemetry(self, name: str, viewer: Principal | None = None) -> Telemetry:
        """A worker's recent heartbeat readings (of the tasks ``viewer`` may see)."""
        found = await self._core.fleet.telemetry(name)
        return await access.scoped_telemetry(self._core.store, viewer, found)

    async def rearm_cancels(self, worker_id: str | None = None) -> None:
        """Queue again the cancels of running tasks not confirmed yet (after a
        restart, or when a worker registers again)."""
        for t in await self._core.store.active_tasks(worker_id):
            if t.cancel_requested and t.state == JobState.running and t.worker_id:
                self._core.mailbox.cancel(t.worker_id, t.id)

    # ------------------------------------------------------------ register

    async def register(
        self,
        reg: WorkerRegistration,
        who: Principal | None = None,
        *,
        worker_id: str | None = None,
        presented: str | None = None,
    ) -> Registered:
        """Admit a worker (new, or the same name coming back) and reconcile its tasks.

        Parameters
        ----------
        reg
            What the worker says about itself.
        who
            Who registers it (None: the control plane itself, trusted): a join token
            may only register a new name (``access.may_register``).
        worker_id
            Set by ``workers/{worker_id}/register``: the worker registering again
            with its own token.
        presented
            That worker token; the worker keeps it (no new token is minted), so an
            answer lost on the way never locks the worker out.

        Raises
        ------
        Conflict
            A join token naming a registered worker (409, field ``name``).
        Forbidden
            A worker token registering another worker.
        """
        core = self._core
        now = core.clock()
        async with core.lock:
            existing = await core.store.worker_by_name(reg.name)
            access.may_register(who, reg.name, existing, worker_id)
            coming_back = worker_id is not None
            worker_id = existing.id if existing is not None else new_id()
            draining = existing is not None and existing.draining
            await core.store.upsert_worker(
                WorkerRecord(
                    id=worker_id,
                    name=reg.name,
                    hostname=reg.hostname,
                    state=WorkerState.draining if draining else WorkerState.ready,
                    info_json=reg.model_dump_json(include=_INFO),
                    registered_at=existing.registered_at if existing else now,
                    last_heartbeat=now,
                    cpu_percent=None,
                    memory_used=None,
                    draining=draining,
                )
            )
            token = await self._token_for(reg.name, worker_id, who, coming_back, presented)
            kill, _ = await self._reconcile(
                worker_id, reg.running_tasks, now, 0.0, reg.acquired_seq, registering=True
            )
            await self.rearm_cancels(worker_id)
        log.info("worker %s (%s) registered", reg.name, worker_id)
        await self._placer.schedule()
        return Registered(
            worker_id=worker_id,
            token=token,
            heartbeat_seconds=core.settings.heartbeat_seconds,
            lease_seconds=core.settings.lease_seconds,
            kill_tasks=kill,
        )

    async def _token_for(
        self,
        name: str,
        worker_id: str,
        who: Principal | None,
        coming_back: bool,
        presented: str | None,
    ) -> str:
        """The token a registration answers: a worker coming back keeps its own (its
        tokens stay valid); any other registration revokes the worker's tokens and
        mints a new one (an admin re-registering a worker mints one beside them)."""
        if coming_back and who is not None and who.role == "worker" and presented:
            return presented
        if not coming_back:
            await self._tokens.revoke_worker(worker_id)
        return await self._tokens.create(f"worker:{name}", "worker", worker_id=worker_id)

    async def forget(self, name: str) -> None:
        """Forget a worker, so that a join token may register its name again (a
        reinstalled machine): its tokens are revoked, its tasks end ``lost`` (retried
        while retries last; a task not started yet goes back to the queue).

        Raises
        ------
        NotFound
            For an unknown worker.
        """
        core = self._core
        async with core.lock:
            row = await core.store.find_worker(name)
            await self._tokens.revoke_worker(row.id)
            why = "its worker was forgotten by an admin"
            stmts: list[Statement] = []
            jobs = []
            for t in await core.store.active_tasks(row.id):
                jobs.append(t.job_id)
                if t.state == JobState.running:
                    stmts += await core.finish(t, JobState.lost, None, why)
                else:
                    stmts += unplaced(core.clock(), await core.job(t.job_id), t, why)
            stmts.append(delete_worker(row.id))
            await core.store.apply(stmts)
            core.fleet.forget(row.id)
            self._acked.pop(row.id, None)
            core.mailbox.take_started(row.id)  # their tasks ended above
        for job_id in jobs:
            core.notify_job(job_id)
        log.info("worker %s (%s) forgotten", row.name, row.id)
        await self._placer.schedule()

    # ----------------------------------------------------------- heartbeat

    async def heartbeat(
        self, worker_id: str, hb: Heartbeat, reporter: Principal | None = None
    ) -> HeartbeatReply:
        """Record a heartbeat, renew leases, and say which tasks to kill."""
        access.own_worker(reporter, worker_id)
        core = self._core
        now = core.clock()
        row = await core.fleet.get(worker_id)
        came_back = row.state in (WorkerState.unhealthy, WorkerState.offline)
        await core.store.heartbeat(worker_id, now, hb.cpu_percent, hb.memory_used_bytes)
        core.fleet.record(worker_id, now, hb)
        grace = 2 * core.settings.heartbeat_seconds
        async with core.lock:
            kill, requeued = await self._reconcile(
                worker_id, hb.running_tasks, now, grace=grace, seen=hb.acquired_seq
            )
            # Cancels that an acquire answer may have lost on the way are sent again.
            listed = set(hb.running_tasks)
            cancel = sorted(
                t.id
                for t in await core.store.active_tasks(worker_id)
                if t.cancel_requested and t.id in listed
            )
        if came_back:
            log.info("worker %s is back", row.name)
        if came_back or requeued:
            await self._placer.schedule()
        return HeartbeatReply(kill_tasks=kill, cancel=cancel)

    async def _reconcile(
        self,
        worker_id: str,
        reported: Sequence[str],
        now: float,
        grace: float,
        seen: int | None = None,
        *,
        registering: bool = False,
    ) -> tuple[list[str], bool]:
        """Compare what a worker says it runs with the store (lock held).

        Returns the reported tasks the control plane no longer runs there (to kill),
        and whether a task went back to the queue. A running task the worker does not
        list is over when the worker had seen the acquire answer that carried it
        (``seen``, its newest ``Acquired.seq``), or, from a worker that does not say,
        when it was picked up more than ``grace`` s ago. Over, it ends ``lost`` (or
        retries) when the worker had acknowledged it (listed it before); one it never
        acknowledged never reached it (its answer was lost on the way) and goes back
        to the queue, not counted as an attempt. A worker ``registering`` without
        ``seen`` may be a new process that cannot say what the old one had: its
        tasks end ``lost``.
        """
        core = self._core
        mine = {
            t.id: t for t in await core.store.active_tasks(worker_id) if t.state == JobState.running
        }
        listed = set(reported)
        kill = sorted(listed - set(mine))
        until = now + core.settings.lease_seconds
        await core.store.renew_leases(worker_id, sorted(listed & set(mine)), until)
        acked = (self._acked.get(worker_id, set()) | listed) & set(mine)
        self._acked[worker_id] = acked
        stmts: list[Statement] = []
        requeued = False
        for tid, t in mine.items():
            if tid in listed:
                continue
            if seen is not None:
                gone = acquire_seq(t.started_at or 0.0) <= seen
            else:
                gone = (t.started_at or 0) < now - grace
            if not gone:
                continue
            job = await core.job(t.job_id)
            if (registering and seen is None) or tid in acked or gangs.is_gang(core.spec(job)):
                stmts += await core.finish(t, JobState.lost, None, "the worker no longer runs it")
            else:
                stmts += unplaced(now, job, t, NEVER_RECEIVED)
                requeued = True
        if stmts:
            await core.store.apply(stmts)
            for tid in mine.keys() - listed:
                core.notify_job(mine[tid].job_id)
        return kill, requeued

    def never_received(self, task: TaskRecord, worker: WorkerRecord | None, now: float) -> bool:
        """Whether a running task whose lease ran out never reached its worker (lock
        held): the worker is heartbeating (not silent), this control plane has heard
        it, and it never listed the task. A worker that had the task lists it in its
        next heartbeat, so a whole lease of heartbeats without it means its answer
        was lost and no later one showed it (see :meth:`_reconcile`)."""
        if worker is None or task.worker_id != worker.id or task.node_rank is not None:
            return False
        alive = worker.state in (WorkerState.ready, WorkerState.draining) and (
            now - (worker.last_heartbeat or 0.0) <= 3 * self._core.settings.heartbeat_seconds
        )
        heard = self._acked.get(worker.id)
        return alive and heard is not None and task.id not in heard

    def _next_seq(self) -> int:
        """A fresh ``Acquired.seq``: the clock in microseconds, never below the last."""
        self._last_seq = max(acquire_seq(self._core.clock()), self._last_seq + 1)
        return self._last_seq

    # ------------------------------------------------------------- acquire

    async def check_channel(self, worker_id: str, reporter: Principal | None) -> None:
        """Refuse a worker's channel before its upgrade: another worker's token (403),
        an unknown worker (404: it registers again)."""
        access.own_worker(reporter, worker_id)
        await self._core.fleet.get(worker_id)

    async def acquire(
        self,
        worker_id: str,
        wait: float,
        reporter: Principal | None = None,
        *,
        resync: bool = False,
    ) -> Acquired | None:
        """New assignments and cancels for a worker; waits up to ``wait`` s for some.

        ``resync`` (a worker whose channel or long poll broke, so an answer may
        have been lost on the way) answers at once, an empty answer when nothing
        waits: either way with a fresh ``seq``, so the heartbeat the worker sends
        once it took it settles any task whose answer never arrived (docs/adr/0150).
        """
        access.own_worker(reporter, worker_id)
        core = self._core
        await core.fleet.require(worker_id)
        if resync:
            got: Acquired | None = await self._take(worker_id, empty=True)
        else:
            got = await core.notifier.wait_for(
                worker_key(worker_id), lambda: self._take(worker_id), wait
            )
        return await self._handed(got)

    async def take_now(self, worker_id: str) -> Acquired | None:
        """What the worker's acquire would answer now (None: nothing), for a push sent
        without waking it (``Core.pushers``)."""
        return await self._handed(await self._take(worker_id))

    async def _handed(self, got: Acquired | None) -> Acquired | None:
        """``got``, once what its handing out changes is done: a session it starts
        lets the cells waiting for it be placed."""
        if got is not None and any(a.spec.kind == JobKind.session for a in got.assignments):
            await self._placer.schedule()  # the session runs now: place the cells waiting for it
        return got

    async def _take(self, worker_id: str, *, empty: bool = False) -> Acquired | None:
        """Start the worker's scheduled tasks and collect its cancels, interrupts and
        the tasks started when they were submitted (:meth:`start_at_submit`); None
        when there is nothing, unless ``empty`` asks for an answer anyway. Its
        ``seq`` is taken under the lock, so an answer carries every task started
        before it (a worker that took it and does not list one never received it)."""
        core = self._core
        async with core.lock:
            cancels = core.mailbox.cancels(worker_id)
            interrupts = core.mailbox.take_interrupts(worker_id)
            # Of the tasks started at submit, those still running (a lease that ran
            # out before the worker asked ended one); read from memory, as whether
            # any task placed on the worker waits to start (ActiveHolds).
            holds = core.store.active_holds
            ready = [a for a in core.mailbox.take_started(worker_id) if holds.running(a.task_id)]
            scheduled = []
            if holds.any_scheduled(worker_id):
                scheduled = [
                    t
                    for t in await core.store.active_tasks(worker_id)
                    if t.state == JobState.scheduled
                ]
            if not scheduled and not cancels and not interrupts and not ready and not empty:
                return None
            seq = self._next_seq()
            stmts: list[Statement] = []
            out = [await self._start(t, stmts, seq / 1e6) for t in scheduled]
            if stmts:
                await core.store.apply(stmts)
            core.mailbox.delivered(worker_id, cancels)  # only once stored
        for a in out:
            core.notify_job(a.job_id)
        return Acquired(assignments=ready + out, cancel=cancels, interrupt=interrupts, seq=seq)

    async def start_at_submit(
        self,
        job: JobRecord,
        spec: JobSpec,
        task: TaskRecord,
        stmts: list[Statement],
        begin: Begin,
    ) -> Assignment | None:
        """Start ``task`` in its submit's own transaction (lock held; ``job`` and
        ``task`` as placed, not stored yet) when its worker's acquire waits now: adds
        the statements to ``stmts`` (``begin``'s, which store the job and the task
        as started, first) and answers the assignment, for ``Mailbox.started`` once
        they are stored. None, adding nothing, when the worker is not listening: the
        task stays ``scheduled`` for its next acquire."""
        assert task.worker_id is not None
        if not self._core.notifier.listening(worker_key(task.worker_id)):
            return None
        now = self._next_seq() / 1e6
        return await self._start(task, stmts, now, job=job, spec=spec, begin=begin)

    async def _start(
        self,
        task: TaskRecord,
        stmts: list[Statement],
        now: float,
        *,
        job: JobRecord | None = None,
        spec: JobSpec | None = None,
        begin: Begin | None = None,
    ) -> Assignment:
        """Add the statements that start ``task`` at ``now`` to ``stmts``; its
        assignment (``job`` and ``spec``: its job as placed, when not stored yet;
        ``begin``: what stores it as started then, for a job not stored yet)."""
        core = self._core
        job = job or await core.job(task.job_id)
        core.instruments.dispatch_latency.observe(max(0.0, now - task.created_at))
        lease = now + core.settings.lease_seconds
        stmts += started(now, job, task, lease) if begin is None else begin(now, lease)
        spec = spec or core.spec(job)
        api_token = None
        # A cell in a session runs in the session's kernel: the session's own
        # api_access decides what that kernel holds.
        if spec.api_access and spec.in_session is None:
            api_token, stmt = self._tokens.for_task(job.owner, task.id)
            stmts.append(stmt)
        # The values travel in this answer only (over TLS off loopback): never stored in
        # clear, never in a read; the job's output is masked with them (secrets.py).
        values, notes = await self._secrets.for_task(job, spec)
        for text in notes:  # a secret deleted (or unreadable) since the submit
            stmts += append_system_line(job.id, task.id, now, text)
        done_calls: list[int] = []
        if task.attempt > 1 and spec.function is not None and spec.function.calls > 1:
            done_calls = await core.store.part_indexes(job.id)  # kept from earlier attempts
        return Assignment(
            task_id=task.id,
            job_id=task.job_id,
            attempt=task.attempt,
            spec=spec.model_copy(),
            gpu_indices=list(task.gpu_indices),
            gang=gangs.gang_of(task),
            api_token=api_token,
            owner=job.owner,
            secrets={k: SecretStr(v) for k, v in values.items()},
            done_calls=done_calls,
        )

    # --------------------------------------------------------------- drain

    async def drain(self, name: str, draining: bool = True) -> Worker:
        """Let a worker finish its tasks and take no new ones (or take them again)."""
        row = await self._core.store.find_worker(name)
        await self._core.store.set_draining(row.id, draining)
        log.info("worker %s %s", row.name, "draining" if draining else "resumed")
        if not draining:
            await self._placer.schedule()
        return next(w for w in await self.all() if w.id == row.id)


#: Why a task whose assignment never reached its worker went back to the queue.
NEVER_RECEIVED = "its assignment never reached the worker (the answer was lost)"


def acquire_seq(started_at: float) -> int:
    """The ``Acquired.seq`` of the answer that started a task at ``started_at``."""
    return round(started_at * 1e6)
