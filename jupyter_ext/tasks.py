"""Task intake: what workers report about their tasks (logs, artifacts, results, ends).

Every method takes the reporting principal; ``access.own_task`` admits a worker
token only for tasks placed on its own worker. A completion decides the job's end
or its retry (through ``Core.finish`` and so ``transitions.py``) and is
idempotent: one for a task that already ended answers the stored task.

Attempt numbers are fencing tokens (docs/adr/0082-fencing.md): logs, metrics,
artifacts, results and completions for a task that is no longer its job's current
attempt (given up as ``lost``, or replaced by a newer attempt) are refused with
:class:`~gpulayer.errors.StaleAttempt` (409 ``stale_attempt``), so only the
current attempt's outcome is ever kept; the worker stops such a task.
"""

import asyncio
import logging
from dataclasses import replace
from typing import Any

from gpulayer.contracts import (
    Artifact,
    BlobRef,
    JobKind,
    JobState,
    LogAck,
    LogBatch,
    LogLine,
    ResultPartBatch,
    Task,
    TaskCompletion,
    TaskEnvironment,
    WorkerState,
)
from gpulayer.errors import Conflict, NotFound, StaleAttempt, ValidationError

from . import access, gangs
from .artifacts import BlobUpload
from .auth import Principal
from .core import Arriving, Core, Ending, ended_reason
from .placer import Placer
from .secrets import Secrets
from .sessions import Sessions
from .store import ArtifactRecord, JobRecord, ResultRecord, Statement, TaskRecord, as_datetime
from .store.writes import forget_parts_of, put_result, set_task_environment
from .streams import job_key, logs_key

log = logging.getLogger(__name__)


class Tasks:
    """Take in what workers report about their tasks."""

    def __init__(self, core: Core, sessions: Sessions, placer: Placer, secrets: Secrets) -> None:
        self._core = core
        self._sessions = sessions
        self._placer = placer
        self._secrets = secrets

    async def reporting(self, reporter: Principal | None, task_id: str) -> TaskRecord:
        """The task, if ``reporter`` may report on it."""
        return access.own_task(reporter, await self._core.task(task_id))

    async def current(self, reporter: Principal | None, task_id: str) -> TaskRecord:
        """:meth:`reporting` for a task that is its job's current attempt
        (:class:`StaleAttempt` otherwise)."""
        task = await self.reporting(reporter, task_id)
        await self._fence(task)
        return task

    async def _current_and_job(
        self, reporter: Principal | None, task_id: str
    ) -> tuple[TaskRecord, JobRecord]:
        """:meth:`current`, and the task's job as the fence read it."""
        task = await self.reporting(reporter, task_id)
        return task, await self._fence(task)

    async def open_task(self, reporter: Principal | None, task_id: str, what: str) -> TaskRecord:
        """:meth:`current` for a task that has not ended (:class:`Conflict` once it has)."""
        return (await self._open_task_and_job(reporter, task_id, what))[0]

    async def _open_task_and_job(
        self, reporter: Principal | None, task_id: str, what: str
    ) -> tuple[TaskRecord, JobRecord]:
        """:meth:`open_task`, and the task's job as the fence read it."""
        task, job = await self._current_and_job(reporter, task_id)
        if task.ended:
            closed = f"; its {what} are closed" if what else ""
            raise Conflict(f"task {task_id} already {task.state}{closed}")
        return task, job

    async def append_logs(
        self, reporter: Principal | None, task_id: str, batch: LogBatch
    ) -> LogAck:
        """Store a worker's log batch (lines it already sent are ignored), with the
        values of the job's secrets masked (whatever the worker did)."""
        task, job = await self._open_task_and_job(reporter, task_id, "logs")
        lines = await self._masked(task, batch, job)
        arriving = await self._announce(task, batch.seq, lines)
        return await self._commit_lines(task, batch.seq, lines, [], arriving)

    async def _masked(
        self, task: TaskRecord, batch: LogBatch, job: JobRecord
    ) -> list[tuple[Any, ...]]:
        """A batch's lines as stored: ``(stream, ts, text, rank)``, the values of the
        secrets of ``job`` (the task's, as the fence read it) masked (whatever the
        worker did)."""
        masker = await self._secrets.masker(task.job_id, job)
        return [
            (e.stream.value, e.ts.timestamp(), masker.mask_line(e.stream.value, e.text), e.rank)
            for e in batch.lines
        ]

    async def _announce(
        self, task: TaskRecord, seq: int, lines: list[tuple[Any, ...]]
    ) -> Arriving | None:
        """Hand a cell's lines to its follower before they commit (docs/adr/0112)."""
        core = self._core
        arriving = await self._arriving(task, seq, lines, core.quotas.log_bytes_per_job)
        if arriving is not None:
            core.arriving[task.job_id] = arriving
            core.notifier.notify(logs_key(task.job_id))
        return arriving

    def _withdraw(self, job_id: str, arriving: Arriving | None) -> None:
        """Take back lines :meth:`_announce` handed out, once stored or refused."""
        if arriving is not None and self._core.arriving.get(job_id) is arriving:
            del self._core.arriving[job_id]

    async def _commit_lines(
        self,
        task: TaskRecord,
        seq: int,
        lines: list[tuple[Any, ...]],
        then: list[Statement],
        arriving: Arriving | None,
    ) -> LogAck:
        """Commit ``lines`` (the first is line ``seq`` of ``task``) and ``then`` (a
        completion's end, when they ride it) in one transaction."""
        core = self._core
        most = core.quotas.log_bytes_per_job
        over = (
            f"gpulayer: this job's log reached its limit of {most} bytes"
            " (c.GpulayerApp.max_log_bytes_per_job); later lines are dropped"
        )
        try:
            n = await core.store.append_logs(task.id, task.job_id, seq, lines, most, over, then)
        finally:
            self._withdraw(task.job_id, arriving)
        core.instruments.log_lines.inc(max(0, n - task.log_seq))
        core.notifier.notify(logs_key(task.job_id))
        return LogAck(next_seq=n)

    async def _arriving(
        self, task: TaskRecord, seq: int, lines: list[tuple[Any, ...]], most: int
    ) -> Arriving | None:
        """The lines of a batch of a cell in a session as they will be stored (their
        offsets after the job's stored lines), for its follower (docs/adr/0112); None
        for other jobs, a batch that repeats lines, or one the quota would cut."""
        core = self._core
        if not lines or seq != task.log_seq or task.job_id not in self._sessions.open_cells:
            return None
        count, used = await core.store.log_usage(task.job_id)
        if used + sum(len(line[2].encode()) for line in lines) > most:
            return None
        return Arriving(
            [
                LogLine(
                    offset=count + i,
                    stream=stream,
                    ts=as_datetime(ts),
                    text=text,
                    task_id=task.id,
                    rank=rank,
                )
                for i, (stream, ts, text, rank) in enumerate(lines)
            ]
        )

    async def set_environment(
        self, reporter: Principal | None, task_id: str, env: TaskEnvironment
    ) -> Task:
        """Keep what a worker says about a task's Python env (preparing, ready with
        the exact versions, or failed)."""
        await self.open_task(reporter, task_id, "")
        await self._core.store.set_task_environment(task_id, env.model_dump_json())
        updated = await self._core.task(task_id)
        return updated.model()

    async def add_artifact(
        self, reporter: Principal | None, task_id: str, name: str, data: bytes | BlobUpload
    ) -> Artifact:
        """Store a file a task produced under its job (:class:`StaleAttempt` for a
        superseded attempt, :class:`Conflict` once the task ended: nothing is added to
        a job after its end)."""
        task = await self.open_task(reporter, task_id, "artifacts")
        sha, size = await self._store_blob(data)
        art = ArtifactRecord(task.job_id, name, sha, size, self._core.clock())
        await self._core.store.put_artifact(art)
        return art.model()

    async def add_result(
        self, reporter: Principal | None, task_id: str, data: bytes | BlobUpload
    ) -> BlobRef:
        """Keep a function task's large result as a blob (its completion names it)."""
        await self.open_task(reporter, task_id, "")
        sha, size = await self._store_blob(data)
        return BlobRef(sha256=sha, size=size)

    async def add_parts(
        self, reporter: Principal | None, task_id: str, batch: ResultPartBatch
    ) -> None:
        """Keep the outcomes of calls a function task finished (docs/adr/0096), so they
        outlive an attempt that never delivers its result; a part kept already stays."""
        task = await self.open_task(reporter, task_id, "results")
        fn = self._core.spec(await self._core.job(task.job_id)).function
        if fn is None:
            raise ValidationError("only a function task has result parts", field="parts")
        for part in batch.parts:
            if part.index >= fn.calls:
                raise ValidationError(
                    f"call {part.index} is not in this task's payload of {fn.calls} call(s)",
                    field="parts.index",
                )
        parts = [(p.index, p.outcome) for p in batch.parts]
        await self._core.store.put_parts(task.job_id, task.id, task.attempt, parts)

    async def _store_blob(self, data: bytes | BlobUpload) -> tuple[str, int]:
        if isinstance(data, BlobUpload):
            return await data.commit()
        return await self._core.blobs.put(data)

    async def blob_size(self, reader: Principal | None, sha256: str) -> int:
        """The size of a stored blob (a bundle, payload or pushed variables) ``reader``
        may fetch for a task (then sent with
        :meth:`~jupyter_ext.artifacts.BlobStore.chunks`, a chunk at a time)."""
        await access.may_read_blob(self._core.store, reader, sha256)
        if not self._core.blobs.exists(sha256):
            raise NotFound(f"no blob {sha256!r}")
        return (await asyncio.to_thread(self._core.blobs.path(sha256).stat)).st_size

    async def complete(
        self, reporter: Principal | None, task_id: str, done: TaskCompletion
    ) -> Task:
        """A worker reports a task's end; decides the job's end or its retry."""
        core = self._core
        seen = core.store.version()
        task, fenced = await self._current_and_job(reporter, task_id)
        # Lines that ride the completion commit with its end, in one transaction; a
        # cell's follower has them first, before the end is worked out (ADR 0112).
        riding = done.logs if done.logs is not None and not task.ended else None
        lines: list[tuple[Any, ...]] = []
        arriving: Arriving | None = None
        if riding is not None:
            lines = await self._masked(task, riding, fenced)
            arriving = await self._announce(task, riding.seq, lines)
            if arriving is not None:
                await asyncio.sleep(0)  # the woken follower answers now
        if done.reason is not None:  # it lands in the job's reason and events
            masker = await self._secrets.masker(task.job_id, fenced)
            done = done.model_copy(update={"reason": masker.mask(done.reason)})
        answer: TaskRecord | None = None  # the task as ended, when known without a read
        if not task.ended:
            job: JobRecord | None = None
            try:
                async with core.lock:
                    # Read again only if anything committed since (a lease that ran
                    # out, a cancel): each read is time a waiting caller waits.
                    unchanged = seen is not None and core.store.version() == seen
                    if not unchanged:
                        task = await core.task(task_id)
                    if task.ended:  # in the meantime (a lease ran out)
                        await self._fence(task)
                        if riding is not None:
                            await self._commit_lines(task, riding.seq, lines, [], arriving)
                    else:
                        now = core.clock()
                        job = fenced if unchanged else await core.job(task.job_id)
                        stmts = await self._ending(task, done, now, job)
                        early = await self._early(task, done, now, job)
                        if early is not None:  # the waiting caller has it while this commits
                            answer = next(t for t in early.tasks if t.id == task_id)
                            core.ending[task.job_id] = early
                            core.notifier.notify(job_key(task.job_id))
                            # The woken caller answers first: its wake-up is ready on
                            # the loop, so this commit waits for the committer's turn,
                            # which comes after it (docs/adr/0139).
                        try:
                            if riding is None:
                                await core.store.apply(stmts)
                            else:
                                await self._commit_lines(task, riding.seq, lines, stmts, arriving)
                        finally:
                            core.ending.pop(task.job_id, None)
            finally:  # refused or failed: the follower no longer has lines not stored
                self._withdraw(task.job_id, arriving)
            job = job or await core.job(task.job_id)
            kind = core.spec(job).kind
            # A call or a cell a second is no news in the server's log; the rest is.
            quiet = kind in (JobKind.function, JobKind.cell)
            log.log(logging.DEBUG if quiet else logging.INFO, "task %s %s", task_id, done.state)
            if kind in (JobKind.cell, JobKind.session):
                await self._sessions.job_ended(task.job_id)
            if done.state == JobState.lost and task.worker_id:
                # The worker gave the task up because it is going away: place nothing
                # more there (its next heartbeat, if any, brings it back).
                await core.store.set_worker_state(task.worker_id, WorkerState.offline)
            core.notify_job(task.job_id)
            await self._placer.schedule()
        return (answer or await core.task(task_id)).model()

    async def _fence(self, task: TaskRecord) -> JobRecord:
        """Refuse reports on ``task`` unless it is its job's current attempt; its job."""
        if task.state == JobState.lost:
            raise StaleAttempt(
                f"task {task.id} (attempt {task.attempt}) was given up as lost"
                f" ({task.reason}); stop it, its job takes no more reports from it"
            )
        job = await self._core.job(task.job_id)
        if task.attempt != job.attempts:
            raise StaleAttempt(
                f"task {task.id} is attempt {task.attempt} of job {job.id}, which runs"
                f" attempt {job.attempts} now; stop it"
            )
        return job

    async def _early(
        self, task: TaskRecord, done: TaskCompletion, now: float, job: JobRecord
    ) -> Ending | None:
        """How a function or cell job reads once ``done`` (its end, inline result and
        all) is committed, for the caller waiting for it (docs/adr/0112); None where
        the end is not that simple (a retry, a cancel, a gang, a map chunk, a result
        kept as a blob): those callers read the store after the commit."""
        state = JobState(done.state)
        if state not in (JobState.succeeded, JobState.failed) or task.cancel_requested:
            return None
        if done.result_blob is not None:
            return None
        core = self._core
        spec = core.spec(job)
        if spec.kind not in (JobKind.function, JobKind.cell) or gangs.is_gang(spec):
            return None
        if spec.function is not None and spec.function.calls > 1:
            return None
        if state == JobState.failed and done.retry and job.attempts <= spec.retries:
            return None  # it goes back to the queue
        why = ended_reason(state, done.reason)
        env = done.environment.model_dump_json() if done.environment else task.environment_json
        ended = replace(task, state=state, exit_code=done.exit_code, reason=why, ended_at=now,
                        environment_json=env)  # fmt: skip
        if job.attempts == 1 and task.attempt == 1:  # not a gang: its one task is this one
            tasks = [ended]
        else:
            tasks = [ended if t.id == task.id else t for t in await core.store.tasks_of_job(job.id)]
        row = replace(job, state=state, reason=why, exit_code=done.exit_code, updated_at=now,
                      ended_at=now)  # fmt: skip
        result = None
        if done.result is not None:
            result = ResultRecord(job.id, task.id, done.result, None, len(done.result))
        return Ending(row, tasks, result)

    async def _ending(
        self, task: TaskRecord, done: TaskCompletion, now: float, job: JobRecord
    ) -> list[Statement]:
        """Statements that record ``done`` for ``task`` of ``job`` at ``now`` (lock held)."""
        reason = done.reason
        if task.cancel_requested and (
            done.state == JobState.cancelled or await self._is_session(task.job_id)
        ):
            reason = await self._cancel_reason(task) or reason  # how it was ended
        state = JobState(done.state)
        stmts = await self._core.finish(
            task, state, done.exit_code, reason, retry=done.retry, reported=True, now=now, job=job
        )
        if done.result is not None or done.result_blob is not None:
            stmts.append(self._result(task, done))
            stmts.append(forget_parts_of(task.job_id, task.id))  # the result holds them too
        if done.environment is not None:
            stmts.append(set_task_environment(task.id, done.environment.model_dump_json()))
        return stmts

    async def _is_session(self, job_id: str) -> bool:
        return self._core.spec(await self._core.job(job_id)).kind == JobKind.session

    async def _cancel_reason(self, task: TaskRecord) -> str | None:
        """The reason the user gave when cancelling ``task`` (e.g. "cancelled by ada")."""
        for e in reversed(await self._core.store.events_of_job(task.job_id)):
            if e.task_id == task.id and e.state == "cancel_requested":
                return e.reason
        return None

    def _result(self, task: TaskRecord, done: TaskCompletion) -> Statement:
        if done.result is not None:
            return put_result(task.job_id, task.id, done.result, None, len(done.result))
        assert done.result_blob is not None
        if not self._core.blobs.exists(done.result_blob):
            raise ValidationError(
                f"result {done.result_blob} was not uploaded (PUT tasks/{{id}}/result first)",
                field="result_blob",
            )
        size = self._core.blobs.path(done.result_blob).stat().st_size
        return put_result(task.job_id, task.id, None, done.result_blob, size)
