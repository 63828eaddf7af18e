"""The shared core the control-plane services are built over.

One :class:`Core` per control plane holds what every service needs: the store,
blobs, long-poll wake-ups, the fleet, the settings and clock, the one lock that
serializes placement and state changes (SQLite has one writer anyway), parsed
job specs, and the :class:`Mailbox` of cancels and interrupts waiting for their
worker's acquire. It also ends tasks (:meth:`Core.finish`), which the lease sweep,
the worker service and the task intake all do.

Job (and task) states are changed only through :mod:`jupyter_ext.transitions`.
"""

import asyncio
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from gpulayer.contracts import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    STORED,
    Assignment,
    JobSpec,
    JobState,
    LogLine,
)
from gpulayer.errors import NotFound

from . import gangs
from .artifacts import BlobStore
from .fleet import Fleet
from .placement import shape
from .prometheus import Instruments
from .provisioning import Board
from .queue import Filing, QueueIndex
from .store import JobRecord, ResultRecord, Statement, Store, TaskRecord
from .store.writes import append_system_line
from .streams import Notifier, job_key, logs_key, worker_key
from .transitions import retry_or_end, task_end

#: Parsed specs kept at most (the least recently used are parsed again when needed):
#: a control plane with 100,000 stored jobs keeps no 100,000 specs in memory.
SPEC_CACHE = 2048


def _filing(spec: JobSpec, key: str) -> Filing:
    """How the queue index files a job of ``spec`` (shape ``key``)."""
    placed = None if spec.in_session else gangs.shape_key(spec, key)
    return Filing(placed, spec.resources, spec.queue_timeout, gangs.is_gang(spec))


def ended_reason(state: JobState, reason: str | None) -> str:
    """The reason a task's end gives its job: the reported one, else the state's."""
    return reason or ("exit code 0" if state == JobState.succeeded else state.value)


@dataclass(frozen=True)
class Ending:
    """A job's end being committed, as the job will read once it is (docs/adr/0112:
    a waiting caller may have its answer before the commit finishes)."""

    job: JobRecord
    tasks: list[TaskRecord]
    result: ResultRecord | None


@dataclass(frozen=True)
class Arriving:
    """A cell's log lines being committed, with the offsets they are stored at
    (docs/adr/0112: its follower may have them before the commit finishes)."""

    lines: list[LogLine]

    @property
    def first(self) -> int:
        """The offset of the first line."""
        return self.lines[0].offset

    @property
    def end(self) -> int:
        """The offset after the last line."""
        return self.lines[-1].offset + 1


def new_id() -> str:
    """A fresh job, task or worker id."""
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Settings:
    """Timings of the control plane (see ``GpulayerApp`` for their meaning)."""

    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    aging_seconds: float = 300.0
    session_idle_seconds: float = 3600.0
    idempotency_seconds: float = 86400.0


@dataclass(frozen=True)
class Quotas:
    """What the control plane keeps for one owner, job or worker at most (see
    ``GpulayerApp`` for the traits and ``docs/security.md``, "Limits")."""

    #: Jobs one owner may have ``queued`` at once; more are refused (429).
    queued_jobs_per_owner: int = 10_000
    #: Log text stored per job; later lines are dropped, with one marker line.
    log_bytes_per_job: int = 64 * 1024 * 1024
    #: JSON size of one worker's telemetry window in memory.
    telemetry_bytes_per_worker: int = 4 * 1024 * 1024


class Mailbox:
    """Cancels, interrupts and started tasks not yet handed to their worker's acquire.

    Cancels stay until an acquire answer that carried them is stored (heartbeat
    replies repeat them anyway); interrupts go out once (docs/adr/0042).
    Assignments of tasks stored as started when they were submitted (a warm
    session's cell, a call placed at once on a worker whose acquire waits;
    docs/adr/0133) go out once, with the next acquire answer.
    """

    def __init__(self) -> None:
        self._cancels: dict[str, set[str]] = defaultdict(set)
        self._interrupts: dict[str, set[str]] = defaultdict(set)
        self._started: dict[str, list[Assignment]] = defaultdict(list)

    def cancel(self, worker_id: str, task_id: str) -> None:
        """Queue a cancel of ``task_id`` for its worker."""
        self._cancels[worker_id].add(task_id)

    def interrupt(self, worker_id: str, task_id: str) -> None:
        """Queue an interrupt of ``task_id`` for its worker."""
        self._interrupts[worker_id].add(task_id)

    def cancels(self, worker_id: str) -> list[str]:
        """The cancels waiting for ``worker_id`` (kept until :meth:`delivered`)."""
        return sorted(self._cancels.get(worker_id, ()))

    def take_interrupts(self, worker_id: str) -> list[str]:
        """The interrupts waiting for ``worker_id``, forgotten now."""
        return sorted(self._interrupts.pop(worker_id, ()))

    def delivered(self, worker_id: str, cancels: Iterable[str]) -> None:
        """An acquire answer carrying ``cancels`` is on its way."""
        self._cancels[worker_id].difference_update(cancels)

    def started(self, worker_id: str, assignment: Assignment) -> None:
        """Queue the assignment of a task already stored as started (lock held)."""
        self._started[worker_id].append(assignment)

    def take_started(self, worker_id: str) -> list[Assignment]:
        """The assignments of started tasks waiting for ``worker_id``, forgotten now."""
        return self._started.pop(worker_id, [])

    def has_started(self, worker_id: str) -> bool:
        """Whether assignments of started tasks wait for ``worker_id``."""
        return bool(self._started.get(worker_id))


class Core:
    """What the services share; see the module docstring."""

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        notifier: Notifier,
        *,
        settings: Settings = Settings(),
        telemetry_samples: int = 900,
        clock: Callable[[], float] = time.time,
        instruments: Instruments | None = None,
        quotas: Quotas = Quotas(),
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.notifier = notifier
        self.settings = settings
        self.clock = clock
        self.instruments = instruments or Instruments()
        self.quotas = quotas
        self.fleet = Fleet(store, telemetry_samples, quotas.telemetry_bytes_per_worker)
        self.mailbox = Mailbox()
        #: Per worker whose live channel has sent its first answer: sends what its
        #: mailbox holds now, at once (``Jobs._store_placed``; docs/adr/0160).
        self.pushers: dict[str, Callable[[], Awaitable[None]]] = {}
        # What the autoscaler says about queued jobs and allocations (docs/providers.md).
        self.board = Board()
        # One placement or state change at a time.
        self.lock = asyncio.Lock()
        # Parsed once while in use: specs never change.
        self._specs: OrderedDict[str, tuple[JobSpec, str]] = OrderedDict()
        #: Queued jobs by placement shape and by queue deadline.
        self.queue = QueueIndex(store.queued)
        #: Ends of function and cell jobs while their commit is in flight, by job id:
        #: a job wait answers from here (``Tasks.complete``).
        self.ending: dict[str, Ending] = {}
        #: A cell's log lines while their batch commits, by job id: its follower
        #: answers from here (``Tasks.append_logs``).
        self.arriving: dict[str, Arriving] = {}

    # ---------------------------------------------------------------- specs

    def remember(self, job_id: str, spec: JobSpec) -> None:
        """Keep a new job's parsed spec, and file it in the queue index."""
        _, key = self._keep(job_id, (spec, shape(spec.resources)))
        self.queue.file_new(job_id, _filing(spec, key))

    def _keep(self, job_id: str, parsed: tuple[JobSpec, str]) -> tuple[JobSpec, str]:
        self._specs[job_id] = parsed
        self._specs.move_to_end(job_id)
        while len(self._specs) > SPEC_CACHE:
            self._specs.popitem(last=False)
        return parsed

    def forget(self, job_id: str) -> None:
        """Drop a deleted job's parsed spec."""
        self._specs.pop(job_id, None)

    def spec(self, job: JobRecord) -> JobSpec:
        """``job``'s spec, parsed once."""
        return self._parsed(job)[0]

    def shape(self, job: JobRecord) -> str:
        """A key equal for jobs whose requirements fit in the same places."""
        return self._parsed(job)[1]

    def _parsed(self, job: JobRecord) -> tuple[JobSpec, str]:
        cached = self._specs.get(job.id)
        if cached is None:
            spec = JobSpec.model_validate_json(job.spec_json, context=STORED)
            return self._keep(job.id, (spec, shape(spec.resources)))
        self._specs.move_to_end(job.id)
        return cached

    async def settle_queue(self) -> QueueIndex:
        """The queue index with every queued job filed in its bucket (lock held):
        the specs of jobs queued since the last call are read (from memory when
        just submitted, else from the store, 500 at a time)."""
        pending = self.queue.pending()
        if pending:
            missing = [r.id for r in pending if r.id not in self._specs]
            rows: dict[str, JobRecord] = {}
            for i in range(0, len(missing), 500):
                rows.update((r.id, r) for r in await self.store.jobs_by_ids(missing[i : i + 500]))
            for ref in pending:
                parsed = self._specs.get(ref.id)
                row = rows.get(ref.id)
                if parsed is None and row is not None:
                    parsed = self._parsed(row)
                if parsed is None:
                    continue  # deleted meanwhile: its change drops it
                self.queue.file(ref, _filing(*parsed))
        self.queue.compact()
        return self.queue

    # ---------------------------------------------------------------- reads

    async def job(self, job_id: str) -> JobRecord:
        """A job by id, or :class:`NotFound`."""
        row = await self.store.get_job(job_id)
        if row is None:
            raise NotFound(f"no job with id {job_id!r}")
        return row

    async def task(self, task_id: str) -> TaskRecord:
        """A task by id, or :class:`NotFound`."""
        row = await self.store.get_task(task_id)
        if row is None:
            raise NotFound(f"no task with id {task_id!r}")
        return row

    async def current_task(self, job_id: str) -> TaskRecord | None:
        """The task of a job's latest attempt."""
        tasks = await self.store.tasks_of_job(job_id)
        return tasks[-1] if tasks else None

    # ------------------------------------------------------------ wake-ups

    def notify_job(self, job_id: str) -> None:
        """Wake whoever waits for the job's state or logs."""
        self.notifier.notify(job_key(job_id))
        self.notifier.notify(logs_key(job_id))

    def notify_worker(self, worker_id: str) -> None:
        """Wake the worker's acquire long poll."""
        self.notifier.notify(worker_key(worker_id))

    def stop(self, stop: Iterable[tuple[str, str]]) -> None:
        """Tell workers (through their acquire long poll) to stop these tasks."""
        for worker_id, task_id in stop:
            self.mailbox.cancel(worker_id, task_id)
            self.notify_worker(worker_id)

    # -------------------------------------------------------------- ending

    async def finish(
        self,
        task: TaskRecord,
        state: JobState,
        exit_code: int | None,
        reason: str | None,
        *,
        retry: bool = True,
        reported: bool = False,
        now: float | None = None,
        job: JobRecord | None = None,
    ) -> list[Statement]:
        """Statements that end ``task`` and move its job on (lock held); ``retry``
        False ends the job even when attempts are left (the failure is its answer);
        ``reported``: the worker reported the end itself, its lines flushed first
        (otherwise a ``lost`` task was given up, and its log says so); ``now``: the
        time of the end (the clock's when not given); ``job``: the task's job as just
        read under the lock (read here when not given)."""
        job = job or await self.job(task.job_id)
        spec = self.spec(job)
        why = ended_reason(state, reason)
        now = self.clock() if now is None else now
        gap = [] if reported else await self._lost_lines(task, state, now)
        if gangs.is_gang(spec):
            tasks = await self.store.tasks_of_job(job.id)
            names = await self.fleet.all_names()
            end = gangs.finish(
                now, job, spec, tasks, task, state, exit_code, why, retry=retry, names=names
            )
            self.stop(end.stop)
            return gap + end.statements
        stmts = task_end(now, task, state, exit_code, why)
        return (
            gap + stmts + retry_or_end(now, job, spec.retries, state, exit_code, why, retry=retry)
        )

    async def _lost_lines(self, task: TaskRecord, state: JobState, now: float) -> list[Statement]:
        """A ``system`` line ending the log of a task given up as ``lost``: how many of
        the lines it produced never arrived ("3 lines lost when local-2 died"), when
        its worker's last heartbeat counted more than were stored; else that lines it
        printed after that heartbeat may be missing. A gap is said, never silent."""
        if state != JobState.lost or task.started_at is None:
            return []  # (one that never started printed nothing)
        produced = self.fleet.lines_produced(task.worker_id, task.id)
        names = await self.fleet.names({task.worker_id})
        worker = names.get(task.worker_id or "", task.worker_id or "its worker")
        if produced is not None and produced > task.log_seq:
            missing = produced - task.log_seq
            text = (
                f"── {missing} line{'s' if missing != 1 else ''} of attempt {task.attempt}"
                f" lost when {worker} died (produced, never delivered)"
            )
        else:
            text = (
                f"── attempt {task.attempt} lost when {worker} died: lines it printed after"
                " the last one above may be missing"
            )
        return append_system_line(task.job_id, task.id, now, text)
