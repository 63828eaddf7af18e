"""The job service: submit, cancel, interrupt, and every read of a job.

Job states (changed only through ``transitions.py``)::

    queued ──▶ scheduled ──▶ running ──▶ succeeded | failed | cancelled | timed_out | lost
      ▲            │            │
      └────────────┴────────────┘   retry (failed or lost, while retries remain)

A job is ``queued`` until placement gives it a task on a worker (``scheduled``);
the worker's acquire long poll picks the task up (``running``, with a lease that
heartbeats renew). The task's end decides the job's end, or puts the job back in
the queue for another attempt.

Every method that takes a ``viewer`` applies ``access.py``: a job the viewer may
not see is answered as if it did not exist.
"""

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from gpulayer.contracts import (
    TERMINAL_STATES,
    Artifact,
    Assignment,
    Event,
    Job,
    JobEnd,
    JobKind,
    JobSpec,
    JobState,
    LogPage,
    Placement,
    ResultPartList,
)
from gpulayer.errors import (
    Conflict,
    GpulayerError,
    InvalidTransition,
    NotFound,
    QuotaExceeded,
    ValidationError,
)

from . import access, gangs
from .auth import Principal
from .core import Core, Ending, new_id
from .placer import Placer
from .provisioning import job_cost
from .secrets import Secrets
from .sessions import Sessions
from .store import IdempotencyRecord, JobRecord, ResultRecord, Statement, TaskRecord
from .store.writes import insert_idempotency_key
from .streams import job_key, logs_key
from .transitions import (
    Begin,
    cancel_requested,
    job_to,
    note,
    submitted,
    submitted_placed,
    task_end,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Kinds whose jobs answer a result.
_ANSWERING = frozenset({JobKind.function, JobKind.cell, JobKind.distributed})
_ACTIVE = frozenset(JobState) - TERMINAL_STATES
#: Starts a task placed at submit (lock held): ``(job, spec, task, statements,
#: begin)``, the job and its task stored by ``begin``.
StartAtSubmit = Callable[
    [JobRecord, JobSpec, TaskRecord, list[Statement], Begin], Awaitable[Assignment | None]
]
#: Expired idempotency keys are pruned at most this often (on a submit).
_PRUNE_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class Submitted:
    """What a submit stored: its jobs, and whether an earlier request with the same
    idempotency key had stored them already (``replayed``: nothing new was stored)."""

    jobs: list[Job]
    replayed: bool = False
    #: The ids of the jobs stored (also when they were not read back).
    job_ids: tuple[str, ...] = ()


class Jobs:
    """Submit, cancel, interrupt and read jobs."""

    def __init__(self, core: Core, sessions: Sessions, placer: Placer, secrets: Secrets) -> None:
        self._core = core
        self._sessions = sessions
        self._placer = placer
        self._secrets = secrets
        self._pruned_at = 0.0
        #: Starts a task placed at submit in the submit's transaction when its
        #: worker's acquire waits (``Workers.start_at_submit``; set by the control plane).
        self.start_at_submit: StartAtSubmit | None = None

    async def visible(self, job_id: str, viewer: Principal | None) -> JobRecord:
        """The job, if ``viewer`` may see it (else :class:`NotFound`)."""
        return access.visible_job(viewer, await self._core.store.get_job(job_id), job_id)

    # -------------------------------------------------------------- submit

    async def submit(self, spec: JobSpec, owner: str, viewer: Principal | None = None) -> Job:
        """Queue a job and try to place it at once."""
        return (await self.submit_many([spec], owner, viewer))[0]

    async def submit_many(
        self, specs: Sequence[JobSpec], owner: str, viewer: Principal | None = None
    ) -> list[Job]:
        """Queue several jobs in one transaction (all or none), then place what fits."""
        return (await self.submit_once(specs, owner, viewer)).jobs

    async def submit_once(
        self,
        specs: Sequence[JobSpec],
        owner: str,
        viewer: Principal | None = None,
        *,
        key: str | None = None,
        answer: bool = True,
    ) -> Submitted:
        """:meth:`submit_many`, at most once per idempotency ``key`` of ``owner``
        (docs/adr/0085): a repeat with the same specs within ``idempotency_seconds``
        answers the jobs the first request stored. Without ``answer`` new jobs are
        not read back (``Submitted.job_ids`` names them: a caller that waits for
        them reads them once they end).

        Raises
        ------
        Conflict
            When ``key`` was used for different specs (``field``: ``Idempotency-Key``).
        """
        dumped = [spec.model_dump_json() for spec in specs]  # stored, and the key's digest
        digest = _digest(dumped) if key is not None else ""
        if key is not None:
            await self._prune()
        try:
            ids: list[str] = []
            jobs = await self._store(specs, dumped, owner, viewer, key, digest, answer, ids)
            return Submitted(jobs, job_ids=tuple(ids))
        except GpulayerError:
            # The key is not read first (each read is time a waiting caller waits):
            # its live record makes the submit's INSERT a conflict, and a repeat
            # that a check refuses now (a queue filled since) answers what it stored.
            earlier = await self._replay(owner, key, digest) if key is not None else None
            if earlier is None:
                raise
            return earlier

    async def _replay(self, owner: str, key: str, digest: str) -> Submitted | None:
        """The jobs an earlier live request with ``key`` stored, or None."""
        found = await self._core.store.idempotency_key(owner, key)
        if found is None or found.created_at < self._key_horizon():
            return None
        if found.digest != digest:
            raise Conflict(
                f"Idempotency-Key {key!r} was already used for a different submit"
                f" (jobs {', '.join(found.job_ids)}); use a new key for a new request",
                field="Idempotency-Key",
            )
        log.info("submit with key %r replayed: jobs %s", key, ", ".join(found.job_ids))
        return Submitted(await self._jobs_of(found), replayed=True, job_ids=tuple(found.job_ids))

    async def _jobs_of(self, found: IdempotencyRecord) -> list[Job]:
        if len(found.job_ids) == 1:
            try:
                return [await self.get(found.job_ids[0])]
            except NotFound:
                return []
        return await self.by_ids(found.job_ids)

    def _key_horizon(self) -> float:
        """Keys recorded before this time have expired."""
        return self._core.clock() - self._core.settings.idempotency_seconds

    async def _prune(self) -> None:
        """Forget expired idempotency keys (at most once a minute)."""
        now = self._core.clock()
        if now - self._pruned_at >= _PRUNE_EVERY_SECONDS:
            self._pruned_at = now
            await self._core.store.prune_idempotency_keys(self._key_horizon())

    async def _store(
        self,
        specs: Sequence[JobSpec],
        dumped: Sequence[str],
        owner: str,
        viewer: Principal | None,
        key: str | None,
        digest: str,
        answer: bool = True,
        stored: list[str] | None = None,
    ) -> list[Job]:
        """Check, store (with the key, in the same transaction) and place new jobs;
        the jobs as stored and placed (none unless ``answer``). ``dumped``: the specs'
        JSON, as stored."""
        core = self._core
        await self._check_queue_quota(owner, len(specs))
        for spec in specs:
            await self._check_blobs(spec, viewer)
        sessions = None
        if any(s.kind in (JobKind.cell, JobKind.session) for s in specs):
            sessions = await self._sessions.check(specs, owner)
        await self._secrets.check(specs, owner)
        now = core.clock()
        ids = [new_id() for _ in specs]
        if stored is not None:
            stored += ids
        keyed: list[Statement] = []
        if key is not None:
            keyed = insert_idempotency_key(owner, key, digest, ids, now, self._key_horizon())
        placed = False
        if len(specs) == 1:  # placed (and started) in the same transaction when it can be
            placed = await self._store_placed(
                ids[0], specs[0], dumped[0], owner, now, keyed, sessions
            )
        if not placed:
            stmts: list[Statement] = []
            for job_id, spec, spec_json in zip(ids, specs, dumped, strict=True):
                stmts += submitted(now, job_id, spec_json, owner, spec.priority)
            await core.store.apply(keyed + stmts)  # a live key fails first
            self._filed(ids, specs, owner, sessions)
        quiet = all(s.kind in (JobKind.function, JobKind.cell) for s in specs)  # calls, cells
        how = "placed" if placed else "queued"
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "%d job(s) %s, first %s",
            len(ids),
            how,
            ids[0],
        )
        if not placed:
            try:
                if all(s.in_session for s in specs):
                    await self._placer.schedule_cells()  # a warm session has its worker already
                else:
                    await self._placer.schedule()
            except Exception:  # the jobs are stored and queued; the next pass places them
                log.exception("placement after submitting %s failed", ids[0])
        if not answer:
            return []
        if len(ids) == 1:
            return [await self.get(ids[0], viewer)]
        return await self.by_ids(ids, viewer=viewer)

    def _filed(
        self,
        ids: Sequence[str],
        specs: Sequence[JobSpec],
        owner: str,
        sessions: dict[tuple[str, str], JobRecord] | None,
    ) -> None:
        """Keep the parsed specs of jobs just stored; note sessions and cells
        (``sessions``: as the submit's checks read them)."""
        for job_id, spec in zip(ids, specs, strict=True):
            self._core.remember(job_id, spec)
            if spec.kind in (JobKind.cell, JobKind.session):
                self._sessions.submitted(job_id, spec, owner, sessions)

    async def _store_placed(
        self,
        job_id: str,
        spec: JobSpec,
        spec_json: str,
        owner: str,
        now: float,
        stmts: list[Statement],
        sessions: dict[tuple[str, str], JobRecord] | None = None,
    ) -> bool:
        """Store a new job placed at once, in one transaction with its submit (and
        ``stmts``, the submit's other statements), when the placement pass after the
        submit would place it right away: a cell of a warm session on its session's
        worker, another job when nothing else is queued and a worker has room. When
        that worker's acquire waits, the task is started in the same transaction and
        its assignment handed to the acquire (``Mailbox.started``); the job and its
        task are stored in their final state at once (``submitted_placed``). False,
        storing nothing, when it cannot be placed at once (docs/adr/0133).
        ``sessions``: the owner's sessions as the submit's checks read them."""
        core = self._core
        async with core.lock:
            if spec.in_session:
                spot = await self._sessions.warm_spot((owner, spec.in_session), sessions)
            else:
                spot = await self._placer.spot_at_submit(spec)
            if spot is None:
                return False
            w, gpus = spot
            job = JobRecord(0, job_id, spec_json, JobState.queued, None, owner, spec.priority,
                            None, 0, None, now, now, None, None, 0)  # fmt: skip
            task_id = new_id()
            as_placed = replace(job, state=JobState.scheduled, attempts=1, worker_id=w.id)
            task = TaskRecord(task_id, job_id, 1, JobState.scheduled, w.id, tuple(gpus), None,
                              None, now, None, None, None, False, 0, None, None, 0)  # fmt: skip

            def begin(at: float, lease: float) -> list[Statement]:
                return submitted_placed(now, job, task_id, w.id, w.name, gpus, at, lease)

            start = self.start_at_submit
            writes: list[Statement] = []
            assignment = None
            if start is not None:
                assignment = await start(as_placed, spec, task, writes, begin)
            if assignment is None:  # placed; its worker's next acquire starts it
                writes = submitted_placed(now, job, task_id, w.id, w.name, gpus)
            await core.store.apply(stmts + writes)  # a live key fails first
            self._filed([job_id], [spec], owner, sessions)
            if assignment is not None:
                core.mailbox.started(w.id, assignment)
        core.instruments.placement_latency.observe(0.0)
        push = core.pushers.get(w.id) if assignment is not None else None
        if push is not None:
            # Sent from here, now: the worker starts while the caller reads its answer,
            # and the channel's acquire, not woken, stays armed.
            await push()
            core.notify_job(job_id)
            return True
        core.notify_worker(w.id)
        core.notify_job(job_id)
        if assignment is not None:
            # Let the woken acquire push the assignment before this submit's answer is
            # read and written: the worker starts while the caller reads its answer.
            await asyncio.sleep(0)
        return True

    async def uploaded(self, sha256: str, uploader: Principal) -> None:
        """Record that ``uploader`` stored blob ``sha256`` (so its jobs may name it)."""
        await self._core.store.add_blob_owner(sha256, uploader.name, self._core.clock())

    async def _check_queue_quota(self, owner: str, more: int) -> None:
        """Refuse jobs that would take ``owner`` past its queued-jobs quota."""
        most = self._core.quotas.queued_jobs_per_owner
        queued = self._core.store.queued.count(owner)
        if queued + more > most:
            raise QuotaExceeded(
                f"{owner!r} has {queued} queued jobs; at most {most} may wait at once"
                " (c.GpulayerApp.max_queued_jobs_per_owner); wait for some to start or"
                " cancel them"
            )

    async def _check_blobs(self, spec: JobSpec, viewer: Principal | None) -> None:
        """Refuse a spec whose bundle, payload or pushed variables were not uploaded,
        or (for a submitter) not uploaded by the submitter itself: both answer the
        same 400, so a submit does not tell whether someone else's blob exists."""
        payload = spec.function.payload_blob if spec.function is not None else None
        push = spec.cell.push_blob if spec.cell is not None else None
        for sha, field, message in (
            (spec.bundle, "bundle", "bundle {} was not uploaded (POST it to /blobs first)"),
            (payload, "function.payload_blob",
             "function payload {} was not uploaded (POST it to /blobs first)"),
            (push, "cell.push_blob",
             "pushed variables {} were not uploaded (POST them to /blobs first)"),
            *[(w.sha256, f"environment.wheels.{i}.sha256",
               f"wheel {w.filename} ({{}}) was not uploaded (POST it to /blobs first)")
              for i, w in enumerate(spec.environment.wheels if spec.environment else [])],
        ):  # fmt: skip
            if sha is None:
                continue
            usable = await access.may_use_blob(self._core.store, viewer, sha)
            if not (usable and self._core.blobs.exists(sha)):
                raise ValidationError(message.format(sha), field=field)

    # --------------------------------------------------------------- reads

    async def by_ids(
        self,
        job_ids: Sequence[str],
        *,
        with_results: bool = False,
        viewer: Principal | None = None,
    ) -> list[Job]:
        """Several jobs (without tasks or pending reasons), in the order of ``job_ids``,
        as ``viewer`` may read them (``env`` values only for their owner and admins)."""
        rows = {r.id: r for r in await self._core.store.jobs_by_ids(job_ids)}
        names = await self._core.fleet.all_names()
        jobs = [
            access.shown(viewer, rows[i].model([], names, self._core.spec(rows[i])))
            for i in job_ids
            if i in rows
        ]
        if with_results:
            ids = [j.id for j in jobs]
            results = await self._core.store.results(ids)
            parts = await self._core.store.part_counts(ids)
            for j in jobs:
                _attach(j, results.get(j.id))
                j.result_parts = parts.get(j.id, 0)
        return jobs

    async def get(
        self, job_id: str, viewer: Principal | None = None, *, with_result: bool = True
    ) -> Job:
        """A job with its tasks, a small result (and, while queued, why it waits); its
        ``env`` values only for its owner and admins."""
        store = self._core.store
        row = await self.visible(job_id, viewer)
        tasks = await store.tasks_of_job(job_id)
        answers = with_result and self._core.spec(row).kind in _ANSWERING and row.ended
        return await self._model(
            row, tasks, viewer, await store.result(job_id) if answers else None
        )

    async def _model(
        self,
        row: JobRecord,
        tasks: list[TaskRecord],
        viewer: Principal | None,
        result: ResultRecord | None,
    ) -> Job:
        """The job ``get`` answers, from its records (``result``: its small result)."""
        core = self._core
        job_id = row.id
        names = await core.fleet.names({t.worker_id for t in tasks} | {row.worker_id})
        job = access.shown(viewer, row.model(tasks, names, core.spec(row)))
        current = [t for t in job.tasks if t.attempt == job.attempts and t.environment]
        if current:  # a gang's nodes build the same env: the first node's speaks for it
            job.environment = min(current, key=lambda t: t.node_rank or 0).environment
        _attach(job, result)
        job.provisioning = core.board.queued_note(job.id, job.state)
        if spans := await core.store.run_spans([job_id]):  # it ran on provider instances
            job.cost = job_cost(spans, core.clock())
        job.result_parts = await self._result_parts(job_id, job.spec)
        if job.state == JobState.queued:
            report, behind = await self._placer.queued_report(row, viewer)
            reasons = [f"{w.worker}: {w.reason}" for w in report.workers] or [report.summary]
            job.pending_reasons = reasons + ([behind] if behind else [])
            if not report.satisfiable:
                job.reason = report.summary
                job.unsatisfiable = True
        return job

    async def recent(
        self,
        state: JobState | None = None,
        limit: int = 100,
        owner: str | None = None,
        viewer: Principal | None = None,
    ) -> list[Job]:
        """Jobs newest first (only ``owner``'s when given; a submitter's own always); a
        queued job no registered worker could ever run is flagged ``unsatisfiable``."""
        owner = access.listed_owner(viewer, owner)
        rows = await self._core.store.list_jobs(state, limit, owner)
        names = await self._core.fleet.all_names()
        never = await self._placer.never_placeable(rows)
        board = self._core.board
        jobs = [
            access.shown(viewer, r.model([], names, self._core.spec(r))).model_copy(
                update={"provisioning": board.queued_note(r.id, r.state)}
            )
            for r in rows
        ]
        for job in jobs:
            if job.id in never:  # said in the list too, not only in the job's own answer
                job.reason, job.unsatisfiable = never[job.id], True
        return jobs

    async def active_count(self) -> int:
        """How many jobs have not ended (queued, scheduled or running)."""
        return await self._core.store.count_jobs(sorted(_ACTIVE))

    async def events(self, job_id: str, viewer: Principal | None = None) -> list[Event]:
        """Every state change of a job, oldest first."""
        await self.visible(job_id, viewer)
        return [e.model() for e in await self._core.store.events_of_job(job_id)]

    async def placement(self, job_id: str, viewer: Principal | None = None) -> Placement:
        """Where a job runs, or per worker why it waits."""
        return await self._placer.explain(await self.visible(job_id, viewer), viewer)

    async def result(self, job_id: str, viewer: Principal | None = None) -> bytes:
        """A function job's pickled outcomes (:class:`NotFound` while it has none)."""
        await self.visible(job_id, viewer)
        row = await self._core.store.result(job_id)
        if row is None:
            raise NotFound(f"job {job_id} has no result (yet)")
        if row.inline is not None:
            return row.inline
        assert row.sha256 is not None
        return await self._core.blobs.read(row.sha256)

    async def parts(self, job_id: str, viewer: Principal | None = None) -> ResultPartList:
        """The outcomes kept apart from a function job's result: calls an attempt
        finished before its worker died (docs/adr/0096)."""
        await self.visible(job_id, viewer)
        return ResultPartList(parts=await self._core.store.parts_of(job_id))

    async def artifacts(self, job_id: str, viewer: Principal | None = None) -> list[Artifact]:
        """A job's artifacts."""
        await self.visible(job_id, viewer)
        return [a.model() for a in await self._core.store.artifacts_of_job(job_id)]

    async def artifact(self, job_id: str, name: str, viewer: Principal | None = None) -> Artifact:
        """One artifact of a job."""
        await self.visible(job_id, viewer)
        found = await self._core.store.get_artifact(job_id, name)
        if found is None:
            raise NotFound(f"job {job_id} has no artifact {name!r}")
        return found.model()

    # --------------------------------------------------------------- waits

    async def wait(
        self, job_id: str, timeout: float, viewer: Principal | None = None
    ) -> Job | None:
        """The job once it ended, or None if it is still going after ``timeout`` s."""

        async def answer(row: JobRecord, early: Ending | None) -> Job:
            if early is None:
                return await self.get(job_id, viewer)
            return await self._model(early.job, early.tasks, viewer, early.result)

        return await self._wait(job_id, timeout, viewer, answer)

    async def wait_end(
        self, job_id: str, timeout: float, viewer: Principal | None = None
    ) -> JobEnd | None:
        """:meth:`wait`, answered as the job's :class:`JobEnd`, made from its records
        (no ``Job``, its spec and tasks, is built)."""
        store = self._core.store

        async def answer(row: JobRecord, early: Ending | None) -> JobEnd:
            if early is not None:
                return await self._end(early.job, early.result)
            answers = self._core.spec(row).kind in _ANSWERING
            return await self._end(row, await store.result(job_id) if answers else None)

        return await self._wait(job_id, timeout, viewer, answer)

    async def _wait(
        self,
        job_id: str,
        timeout: float,
        viewer: Principal | None,
        answer: Callable[[JobRecord, Ending | None], Awaitable[T]],
    ) -> T | None:
        """``answer(row, early)`` once the job ended (``early``: its end while it is
        being committed, docs/adr/0112), or None after ``timeout`` s."""
        core = self._core
        seen = core.store.version()
        first: JobRecord | None = await self.visible(job_id, viewer)

        async def ended() -> T | None:
            nonlocal first
            early = core.ending.get(job_id)  # its end is being committed (docs/adr/0112)
            if early is not None:
                return await answer(early.job, early)
            # The row just read is the file's while nothing committed since.
            row, first = first, None
            if row is None or seen is None or core.store.version() != seen:
                row = await core.store.get_job(job_id)
            return await answer(row, None) if row is not None and row.ended else None

        return await self._core.notifier.wait_for(job_key(job_id), ended, timeout)

    async def _end(self, row: JobRecord, result: ResultRecord | None) -> JobEnd:
        """The :class:`JobEnd` of ``row`` (``result``: its small result)."""
        core = self._core
        names = await core.fleet.names({row.worker_id})
        return JobEnd(
            id=row.id,
            state=row.state,
            reason=row.reason,
            exit_code=row.exit_code,
            worker_name=names.get(row.worker_id or ""),
            result=None if result is None else result.inline,
            result_size=None if result is None else result.size,
            log_lines=row.log_count,
            result_parts=await self._result_parts(row.id, core.spec(row)),
        )

    async def _result_parts(self, job_id: str, spec: JobSpec) -> int:
        """The outcomes kept apart of a function job of several calls (0 for others)."""
        if spec.function is None or spec.function.calls <= 1:
            return 0
        return (await self._core.store.part_counts([job_id])).get(job_id, 0)

    async def wait_any(
        self, job_ids: Sequence[str], timeout: float, viewer: Principal | None = None
    ) -> list[Job] | None:
        """The jobs among ``job_ids`` that ended (with small results), as soon as at
        least one has; None if none did within ``timeout`` s."""
        unique = list(dict.fromkeys(job_ids))
        access.visible_jobs(viewer, await self._core.store.jobs_by_ids(unique), unique)

        async def ended() -> list[Job] | None:
            rows = await self._core.store.jobs_by_ids(unique)
            done = [r.id for r in rows if r.ended]
            return await self.by_ids(done, with_results=True, viewer=viewer) if done else None

        return await self._core.notifier.wait_for([job_key(i) for i in unique], ended, timeout)

    async def logs(
        self,
        job_id: str,
        offset: int,
        limit: int,
        wait: float,
        viewer: Principal | None = None,
        attempt: int | None = None,
    ) -> LogPage:
        """Lines from ``offset`` (only attempt ``attempt``'s when given); waits up to
        ``wait`` s for the first new one."""
        core = self._core
        store = core.store
        seen = store.version()
        row = await self.visible(job_id, viewer)
        first = True

        async def page() -> LogPage | None:
            nonlocal first
            early = core.arriving.get(job_id)  # a cell's lines being committed (ADR 0112)
            if early is not None and attempt is None and early.first <= offset < early.end:
                lines = [line for line in early.lines if line.offset >= offset][:limit]
                return LogPage(lines=lines, next_offset=lines[-1].offset + 1, complete=False)
            if first:  # what the job's row just said holds while nothing committed since
                first = False
                unchanged = seen is not None and store.version() == seen
                if unchanged and not row.ended and row.log_count <= offset:
                    return None  # no line there yet: wait (a follower asks as a cell starts)
            got = await store.log_page(job_id, offset, limit, attempt)
            return got if (got.lines or got.complete) else None

        if wait > 0:
            found = await self._core.notifier.wait_for(logs_key(job_id), page, wait)
            if found is not None:
                return found
        return await store.log_page(job_id, offset, limit, attempt)

    # ------------------------------------------------------ cancel, interrupt

    async def cancel(
        self, job_id: str, by: str, *, reason: str | None = None, viewer: Principal | None = None
    ) -> Job:
        """Cancel a job: at once while queued or not yet picked up, else through its
        worker; ``reason`` replaces the default "cancelled by BY".

        Raises
        ------
        InvalidTransition
            When the job already ended.
        """
        core = self._core
        await self.visible(job_id, viewer)
        async with core.lock:
            row = await core.job(job_id)
            if row.ended:
                raise InvalidTransition(
                    f"job {job_id} already {row.state}; there is nothing to cancel"
                )
            stmts = await self._cancelling(row, reason or f"cancelled by {by}")
            # Committed under the lock, like every state change: a placement pass
            # waiting for the lock then finds the job out of the queue. Committed
            # after it, the pass could place the job from the queue as it was
            # before the cancel, and the cancelled job would run.
            if stmts:
                await core.store.apply(stmts)
        if stmts is None:  # already asked
            return await self.get(job_id, viewer)
        core.notify_job(job_id)
        log.info("job %s: cancel requested", job_id)
        return await self.get(job_id, viewer)

    async def _cancelling(self, row: JobRecord, reason: str) -> list[Statement] | None:
        """Statements that cancel ``row`` (lock held); None when a cancel of its
        running task was already requested."""
        core = self._core
        now = core.clock()
        spec = core.spec(row)
        if spec.kind == JobKind.session:
            self._sessions.end_requested(row.id)
        task = await core.current_task(row.id)
        if gangs.is_gang(spec):  # every node at once
            end = gangs.cancel(now, row, await core.store.tasks_of_job(row.id), reason)
            core.stop(end.stop)
            return end.statements
        if row.state == JobState.running and task is not None and task.state == JobState.running:
            if task.cancel_requested:
                return None
            assert task.worker_id is not None
            core.mailbox.cancel(task.worker_id, task.id)
            core.notify_worker(task.worker_id)
            return cancel_requested(now, task, reason)
        stmts: list[Statement] = []
        if task is not None and task.state == JobState.scheduled:
            stmts += task_end(now, task, JobState.cancelled, None, reason)
        return stmts + job_to(now, row, JobState.cancelled, reason)

    async def interrupt(self, job_id: str, by: str, viewer: Principal | None = None) -> Job:
        """Interrupt a cell (SIGINT to its kernel); one not started yet is cancelled.

        Raises
        ------
        ValidationError
            When the job is not a cell.
        InvalidTransition
            When it already ended.
        """
        core = self._core
        row = await self.visible(job_id, viewer)
        if core.spec(row).kind != JobKind.cell:
            raise ValidationError(f"job {job_id} is not a cell; cancel it instead", field="kind")
        if row.ended:
            raise InvalidTransition(f"job {job_id} already {row.state}; nothing to interrupt")
        task = await core.current_task(job_id)
        if row.state != JobState.running or task is None or task.state != JobState.running:
            return await self.cancel(job_id, by, reason=f"interrupted by {by} before it started")
        assert task.worker_id is not None
        await core.store.apply(
            note(core.clock(), job_id, task.id, "interrupt_requested", f"interrupted by {by}")
        )
        core.mailbox.interrupt(task.worker_id, task.id)
        core.notify_worker(task.worker_id)
        log.info("job %s: interrupt requested", job_id)
        return await self.get(job_id, viewer)


def _attach(job: Job, row: ResultRecord | None) -> None:
    """Put a stored result on ``job``: its size, and its bytes when kept inline."""
    if row is not None:
        job.result_size = row.size
        job.result = row.inline


def _digest(dumped: Sequence[str]) -> str:
    """What a repeat of a submit must match: the specs as parsed (their JSON), in order."""
    h = hashlib.sha256()
    for spec_json in dumped:
        h.update(spec_json.encode())
        h.update(b"\n")
    return h.hexdigest()
