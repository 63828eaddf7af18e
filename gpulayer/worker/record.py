"""The agent's record of one assignment, from its start until its result is delivered."""

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpulayer import contracts as c
from gpulayer.worker.environments import EnvHold
from gpulayer.worker.logs import LogShipper
from gpulayer.worker.parts import PartShipper
from gpulayer.worker.runs import Run
from gpulayer.worker.training_metrics import METRICS_FILE_ENV, TrainingMetricsFollower
from gpulayer.worker.workspace import TaskDir

log = logging.getLogger(__name__)

T = TypeVar("T")

MetricsSender = Callable[[c.MetricBatch], Awaitable[c.MetricAck | None]]
EnvSender = Callable[[str, c.TaskEnvironment], Awaitable[None]]


@dataclass(eq=False)
class TaskRecord:
    """One assignment: its log shipper, run, folder and training metrics, and how it
    is being stopped (cancelled, released to be retried, or abandoned)."""

    assignment: c.Assignment
    logs: LogShipper
    send_metrics: MetricsSender
    pipeline: "asyncio.Task[None] | None" = None  # runs and delivers the task
    run: Run | None = None
    dir: TaskDir | None = None
    metrics: TrainingMetricsFollower | None = None
    metrics_loop: "asyncio.Task[None] | None" = None
    cancel_reason: str | None = None
    interrupted: bool = False  # an interrupt came, maybe before the run did
    abandoned: bool = False  # the control plane gave up on it: report nothing more
    released: bool = False  # the worker stops: report ``lost``, so it is retried
    fenced: bool = False  # stopped because the lease may be lost: report ``lost``
    parts: PartShipper | None = None  # a function task of several calls: their outcomes
    parts_loop: "asyncio.Task[None] | None" = None
    env_hold: EnvHold | None = None  # its Python env, kept from eviction while it runs
    env_sent: "asyncio.Task[None] | None" = None  # the last env report, in order
    env_on_completion: c.TaskEnvironment | None = None  # a cache hit, sent with the end

    @property
    def id(self) -> str:
        return self.assignment.task_id

    def cancel(self, reason: str) -> None:
        """Stop the run; the task still reports ``cancelled`` with ``reason``."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.run is not None:
            self.run.cancel(self.cancel_reason)

    def fence(self, reason: str) -> None:
        """Stop the run because the worker may have lost its lease; it reports ``lost``
        (unless it succeeded first), so the control plane retries it."""
        self.fenced = True
        self.cancel(reason)

    def interrupt(self) -> None:
        """SIGINT a cell's kernel (other runs have nothing to interrupt); one that
        comes while the run is prepared reaches it once it exists."""
        self.interrupted = True
        if self.run is not None:
            self.run.interrupt()

    def abandon(self, why: str) -> None:
        """Stop the run and report nothing more about this task."""
        if not self.abandoned:
            log.info("task %s abandoned: %s", self.id, why)
        self.abandoned = True
        self.logs.stop()
        if self.parts is not None:
            self.parts.stop()
        self.cancel(why)

    def report_env(self, send: EnvSender, env: c.TaskEnvironment) -> None:
        """Send ``env`` after the reports before it, without waiting for it (a cache hit
        costs no round trip); :meth:`env_reported` waits for them all."""
        before = self.env_sent

        async def chained() -> None:
            if before is not None:
                await before
            try:
                await send(self.id, env)
            except Exception:  # a report is for people: the task goes on without it
                log.exception("task %s: environment report not sent", self.id)

        self.env_sent = asyncio.create_task(chained(), name=f"env-{self.id}")

    async def env_reported(self) -> None:
        """Wait until every env report was sent (before the task completes)."""
        if self.env_sent is not None:
            await self.env_sent

    def release_env(self) -> None:
        """Let the task's Python env go (it may be evicted once nothing holds it)."""
        if self.env_hold is not None:
            self.env_hold.release()
            self.env_hold = None

    def follow_metrics(self, env: dict[str, str]) -> None:
        """Point the task's ``$GPULAYER_METRICS_FILE`` into its folder and follow it."""
        assert self.dir is not None
        path = self.dir.root / "metrics.jsonl"
        env[METRICS_FILE_ENV] = str(path)
        self.metrics = TrainingMetricsFollower(path, self.send_metrics)
        self.metrics_loop = asyncio.create_task(self.metrics.run(), name=f"metrics-{self.id}")

    async def file_work(self, fn: Callable[[], T]) -> T:
        """Blocking file work for the task: inline for a function call, whose folder
        is nearly always empty (a thread hand-off costs more than the work), else in
        a thread."""
        if self.assignment.spec.function is not None:
            return fn()
        return await asyncio.to_thread(fn)

    async def make_dir(
        self,
        tasks_root: Path,
        *,
        hand_over: bool = False,
        own_home: bool = True,
        spare: TaskDir | None = None,
    ) -> TaskDir:
        """Create the task's fresh folder under ``tasks_root`` and keep it; with
        ``hand_over``, give it to the task user in the same hand-off (when the worker
        puts nothing in it first); ``own_home``: see :meth:`TaskDir.create`.
        ``spare``: an empty folder an earlier call of the same owner left, handed
        over already, taken instead when it can be (:meth:`TaskDir.reuse_as`)."""

        def make() -> TaskDir:
            if spare is not None:
                try:
                    return spare.reuse_as(tasks_root, self.id)
                except OSError:
                    shutil.rmtree(spare.root, ignore_errors=True)
            folder = TaskDir.create(tasks_root, self.id, own_home=own_home)
            if hand_over:
                folder.hand_over()
            return folder

        self.dir = await self.file_work(make)
        return self.dir
