"""The headless worker agent behind ``gpulayer join URL --token T``.

The agent only ever calls out (docs/api.md, "Worker protocol"): it registers with
the join token, then uses its own worker token to heartbeat, long-poll for
assignments, ship logs, upload artifacts and complete tasks. Two loops run side
by side, plus one pipeline per task::

    register ─┬─ heartbeat loop   every heartbeat_seconds; kill_tasks -> abandon
              ├─ acquire loop     POST acquire?wait=30 -> start assignments, cancel
              └─ task pipeline    prepare dir + bundle -> CommandRun -> flush logs
                                  -> upload artifacts -> complete -> remove dir

The control plane may restart at any time. Every request retries transport
errors and 5xx answers with capped exponential backoff, forever, so a finished
task's logs and completion wait in memory until the server is back. A 401 (or a
404 on a ``workers/{id}`` route) means the server forgot this worker: the agent
registers again under the same name, listing its running tasks, and carries on.
"""

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
import psutil
import pydantic

import gpulayer
from gpulayer import contracts as c
from gpulayer import tls
from gpulayer.errors import (
    CertificateMismatch,
    ConfigError,
    GpulayerError,
    NotFound,
    ValidationError,
    error_for_code,
)
from gpulayer.worker import devices, rank_call
from gpulayer.worker.functions import FunctionRun, RunnerPool
from gpulayer.worker.kernels import CellTaskRun, KernelHost, SessionRun
from gpulayer.worker.logs import LogShipper
from gpulayer.worker.process import (
    CommandRun,
    TaskDir,
    TreeSampler,
    inherited_env,
    task_env,
    task_vars,
)
from gpulayer.worker.runs import Run, RunOutcome
from gpulayer.worker.torchrun import GangRun
from gpulayer.worker.training_metrics import METRICS_FILE_ENV, TrainingMetricsFollower

log = logging.getLogger(__name__)

_BACKOFF_START_SECONDS = 0.2
_BACKOFF_CAP_SECONDS = 2.0
_ACQUIRE_WAIT_SECONDS = 30
_SHUTDOWN_DELIVERY_SECONDS = 5.0
_ARTIFACT_STRIKES = 3  # failed uploads of one file, server otherwise up, before giving up
_CHUNK_BYTES = 1024 * 1024
_CELL_BATCH_SECONDS = 0.002

Content = bytes | Callable[[], AsyncIterator[bytes]]
T = TypeVar("T")


class _Request(TypedDict, total=False):
    """What :meth:`Agent._call` passes on to :meth:`Agent._send`."""

    body: pydantic.BaseModel | None
    params: dict[str, int] | None
    content: Content | None
    headers: dict[str, str] | None
    retry: bool


@dataclass
class AgentConfig:
    """How ``gpulayer join`` runs this worker."""

    url: str  # Jupyter server root URL incl. base_url, e.g. "http://127.0.0.1:8765/a%40b/"
    token: str  # join token (role join)
    name: str | None = None  # default: hostname
    slots: int = 4  # tasks at once
    data_dir: Path | None = None  # default: tempfile.gettempdir()/gpulayer-worker-<name>
    labels: dict[str, str] = field(default_factory=dict)
    kill_grace_seconds: float = 5.0  # SIGTERM -> SIGKILL grace
    log_batch_seconds: float = 0.05  # how long to gather log lines into one batch
    fingerprint: str | None = None  # pinned sha256 of the server's TLS certificate
    warm_runners: int = 1  # function runners started ahead of the first call
    runner_max_calls: int = 1000  # calls before a function runner is replaced
    address: str | None = None  # where other workers reach this one (gang rendezvous)


@dataclass(eq=False)
class _Task:
    """The agent's record of one assignment until its result is delivered."""

    assignment: c.Assignment
    logs: LogShipper
    shipper: "asyncio.Task[None] | None" = None
    pipeline: "asyncio.Task[None] | None" = None
    run: Run | None = None
    dir: TaskDir | None = None
    metrics: TrainingMetricsFollower | None = None
    metrics_loop: "asyncio.Task[None] | None" = None
    cancel_reason: str | None = None
    abandoned: bool = False
    released: bool = False

    @property
    def id(self) -> str:
        return self.assignment.task_id

    def cancel(self, reason: str) -> None:
        """Stop the process; the task still reports ``cancelled`` with ``reason``."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.run is not None:
            self.run.cancel(self.cancel_reason)

    def interrupt(self) -> None:
        """SIGINT a cell's kernel (other runs have nothing to interrupt)."""
        if self.run is not None:
            self.run.interrupt()

    def abandon(self, why: str) -> None:
        """Stop the process and report nothing more about this task."""
        if not self.abandoned:
            log.info("task %s abandoned: %s", self.id, why)
        self.abandoned = True
        self.logs.stop()
        self.cancel(why)


class Agent:
    """One running worker: registration, loops, tasks. Use :func:`run_agent`."""

    def __init__(self, config: AgentConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.name = config.name or socket.gethostname()
        self.data_dir = Path(
            config.data_dir or Path(tempfile.gettempdir(), f"gpulayer-worker-{self.name}")
        ).absolute()
        self.devices = devices.discover()
        self._gpu_telemetry = devices.GpuTelemetry(self.devices)
        self._trees = TreeSampler()
        self._base = config.url.rstrip("/") + c.API_PREFIX + "/"
        self._http = http
        self._slots = asyncio.Semaphore(config.slots)
        self._tasks: dict[str, _Task] = {}
        self._blob_locks: dict[str, asyncio.Lock] = {}
        self._worker_id = ""
        self._worker_token = ""
        self._heartbeat_seconds = 10.0
        self._registrations = 0  # bumped by every successful registration
        self._register_lock = asyncio.Lock()
        self._outage_since: float | None = None
        self._runners = RunnerPool(
            inherited_env(),
            max_idle=config.slots,
            max_calls=config.runner_max_calls,
            prestart=config.warm_runners,
        )
        self._kernels = KernelHost()
        self._registration()  # fail fast on a bad name, slots or labels

    # ------------------------------------------------------------ life cycle

    async def serve(self) -> None:
        """Register, then heartbeat and acquire until cancelled."""
        psutil.cpu_percent(None)  # the first reading is meaningless; start the window
        self._runners.start()
        await self._register()
        await asyncio.gather(self._heartbeat_loop(), self._acquire_loop())

    async def shutdown(self) -> None:
        """Release every task (reported ``lost``, so it is retried), and wait for its processes."""
        self._gpu_telemetry.close()
        tasks = list(self._tasks.values())
        if not tasks:
            await self._runners.close()
            await self._kernels.close()
            return
        log.info("worker %s stopping %d running task(s)", self.name, len(tasks))
        for task in tasks:
            task.released = True  # reported `lost`, so the control plane retries it
            task.cancel("worker shutting down")
        pipelines = [t.pipeline for t in tasks if t.pipeline is not None]
        deadline = self.config.kill_grace_seconds + _SHUTDOWN_DELIVERY_SECONDS
        _, late = await asyncio.wait(pipelines, timeout=deadline)
        for pipeline in late:
            pipeline.cancel()  # CommandRun SIGKILLs whatever is left
        await asyncio.gather(*late, return_exceptions=True)
        await self._runners.close()
        await self._kernels.close()

    # ---------------------------------------------------------- registration

    def _registration(self) -> c.WorkerRegistration:
        vm = psutil.virtual_memory()
        try:
            return c.WorkerRegistration(
                name=self.name,
                hostname=socket.gethostname(),
                cpus=os.cpu_count() or 1,
                memory_bytes=vm.total,
                devices=self.devices,
                labels=self.config.labels,
                slots=self.config.slots,
                version=gpulayer.__version__,
                python=f"{sys.version_info.major}.{sys.version_info.minor}",
                running_tasks=self._running_ids(),
                address=self.config.address or advertise_address(self.config.url),
            )
        except pydantic.ValidationError as e:
            raise ConfigError(f"cannot register this worker: {e}") from e

    async def _register(self) -> None:
        """Exchange the join token for a worker id and token.

        Raises
        ------
        GpulayerError
            If the control plane rejects the registration (e.g. a bad join token).
        """
        resp = await self._send(
            "POST", "workers/register", token=self.config.token, body=self._registration()
        )
        if not resp.is_success:
            raise _error(resp, "registration rejected")
        reg = c.Registered.model_validate(resp.json())
        self._worker_id, self._worker_token = reg.worker_id, reg.token
        self._heartbeat_seconds = reg.heartbeat_seconds
        self._registrations += 1
        log.info(
            "registered worker %s as %s (%d GPUs)", self.name, reg.worker_id, len(self.devices)
        )
        self._kill(reg.kill_tasks)

    async def _register_again(self, seen: int) -> None:
        """Register again unless someone already did since registration ``seen``."""
        async with self._register_lock:
            delay, warned = _BACKOFF_START_SECONDS, False
            while self._registrations == seen:
                try:
                    await self._register()
                except GpulayerError as e:
                    if not warned:
                        log.error("worker %s cannot register again (%s); retrying", self.name, e)
                        warned = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _BACKOFF_CAP_SECONDS)

    # --------------------------------------------------------------- loops

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_seconds)
            try:
                await self._heartbeat()
            except Exception:  # a loop of the agent: log and keep beating
                log.exception("heartbeat failed")

    async def _heartbeat(self, *, retry: bool = True) -> bool:
        """Send one heartbeat; True when the control plane answered it (below 500)."""
        vm = psutil.virtual_memory()
        running = self._running_ids()
        pids = {t.run.pid: t.id for t in self._tasks.values() if t.run and t.run.pid}
        beat = c.Heartbeat(
            running_tasks=running,
            cpu_percent=psutil.cpu_percent(None),
            memory_used_bytes=vm.total - vm.available,
            gpus=self._gpu_telemetry.sample(),
            tasks=[self._trees.sample(task_id, pid) for pid, task_id in pids.items()],
        )
        self._trees.forget(set(pids))
        try:
            resp = await self._call("POST", "heartbeat", body=beat, worker_route=True, retry=retry)
        except httpx.TransportError:
            return False
        if resp.is_success:
            reply = c.HeartbeatReply.model_validate(resp.json())
            self._kill(reply.kill_tasks)
            self._cancel(reply.cancel)
        elif resp.status_code < 500:
            log.warning("heartbeat refused: %s", _describe(resp))
        return resp.status_code < 500

    async def _acquire_loop(self) -> None:
        delay = _BACKOFF_START_SECONDS
        while True:
            try:
                resp = await self._call(
                    "POST", "acquire", params={"wait": _ACQUIRE_WAIT_SECONDS}, worker_route=True
                )
                if resp.is_success:
                    if resp.status_code != 204:  # 204: the hold ran out; ask again at once
                        self._dispatch(c.Acquired.model_validate(resp.json()))
                    delay = _BACKOFF_START_SECONDS
                    continue
                if delay == _BACKOFF_START_SECONDS:  # once per streak of refusals
                    log.warning("acquire refused: %s; retrying", _describe(resp))
            except Exception:  # a loop of the agent: log, back off, poll again
                log.exception("acquire failed; retrying")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_CAP_SECONDS)

    def _dispatch(self, acquired: c.Acquired) -> None:
        self._cancel(acquired.cancel)
        for task_id in acquired.interrupt:
            if task := self._tasks.get(task_id):
                task.interrupt()
        for assignment in acquired.assignments:
            if assignment.task_id not in self._tasks:  # a re-sent assignment runs once
                self._start(assignment)

    def _running_ids(self) -> list[str]:
        """Tasks whose results are not delivered yet (their leases must stay alive)."""
        return [task_id for task_id, task in self._tasks.items() if not task.abandoned]

    def _cancel(self, task_ids: list[str]) -> None:
        """Stop user-cancelled tasks (repeats are harmless: a cancel happens once)."""
        for task_id in task_ids:
            if task := self._tasks.get(task_id):
                task.cancel("cancelled by user")

    def _kill(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            if task := self._tasks.get(task_id):
                task.abandon("the control plane gave up on it")

    # --------------------------------------------------------------- tasks

    def _start(self, assignment: c.Assignment) -> None:
        task_id = assignment.task_id
        send = functools.partial(self._send_logs, task_id)
        batch = self.config.log_batch_seconds
        if assignment.spec.kind == c.JobKind.cell:  # a cell's output is watched live
            batch = min(batch, _CELL_BATCH_SECONDS)
        logs = LogShipper(task_id, send, batch_seconds=batch)
        task = _Task(assignment, logs)
        self._tasks[task_id] = task
        if assignment.spec.session is not None:
            self._kernels.expect(assignment.spec.session.name)
        task.shipper = asyncio.create_task(logs.run(), name=f"logs-{task_id}")
        task.pipeline = asyncio.create_task(self._pipeline(task), name=f"task-{task_id}")

    async def _pipeline(self, task: _Task) -> None:
        """Run one task and deliver its result; the boundary for its errors."""
        try:
            try:
                outcome = await self._execute(task)
            except Exception as e:  # a task boundary: the failure becomes the task's state
                log.exception("task %s: worker error", task.id)
                outcome = RunOutcome("failed", None, f"worker error: {e!r}")
                task.logs.add(c.LogStream.system, outcome.reason or "", _now())
            if task.released and outcome.state == "cancelled":
                outcome = RunOutcome("lost", outcome.exit_code, outcome.reason)
            log.log(
                logging.DEBUG if task.assignment.spec.function else logging.INFO,
                "task %s ended: %s%s",
                task.id,
                outcome.state,
                _because(outcome.reason),
            )
            if not task.abandoned:
                await self._deliver(task, outcome)
            if task.dir is not None:
                await _quick(task, task.dir.remove)
                task.dir = None
        except Exception:  # a task boundary: nothing more can be delivered
            log.exception("task %s: result not delivered", task.id)
        finally:
            task.logs.stop()
            if task.shipper is not None:
                task.shipper.cancel()
            if task.metrics_loop is not None:
                task.metrics_loop.cancel()
            if task.dir is not None:
                task.dir.remove()  # after a cancel or error; a no-op when already gone
            self._tasks.pop(task.id, None)

    async def _execute(self, task: _Task) -> RunOutcome:
        a = task.assignment
        if a.spec.in_session:  # runs in its session's kernel, slot and GPUs
            return await self._run_kernel_task(task)
        async with self._slots:
            if task.cancel_reason is not None:
                return RunOutcome("cancelled", None, task.cancel_reason)
            fn = a.spec.function
            if a.spec.kind in (c.JobKind.cell, c.JobKind.session):
                return await self._run_kernel_task(task)
            log.log(
                logging.DEBUG if fn else logging.INFO,
                "task %s (job %s, attempt %d) started",
                a.task_id,
                a.job_id,
                a.attempt,
            )
            if fn is None or a.gang is not None:  # a call stays quiet: its log is its prints
                gpus = ", ".join(str(i) for i in a.gpu_indices)
                where = (
                    f"GPU {gpus}"
                    if len(a.gpu_indices) == 1
                    else f"GPUs {gpus}"
                    if gpus
                    else "no GPU"
                )
                task.logs.add(c.LogStream.system, f"started on {self.name} ({where})", _now())
            root = self.data_dir / "tasks"
            task.dir = await _quick(task, functools.partial(TaskDir.create, root, a.task_id))
            try:
                if a.spec.bundle is not None:
                    data = await self._blob(a.spec.bundle)
                    await asyncio.to_thread(task.dir.unpack, data)
                if fn is not None:
                    payload = (
                        fn.payload
                        if fn.payload is not None
                        else await self._blob(fn.payload_blob or "")
                    )
            except GpulayerError as e:
                task.logs.add(c.LogStream.system, str(e), _now())
                return RunOutcome("failed", None, str(e))
            if fn is not None and a.gang is not None:
                return await self._run_gang_call(task, payload)
            if fn is not None:  # the runner has the rest of the environment already
                env = task_vars(a, task.dir.artifacts)
                task.run = FunctionRun(
                    self._runners, a, payload, env=env, cwd=task.dir.work, on_line=task.logs.add
                )
            else:
                env = task_env(a, task.dir.artifacts)
                self._follow_metrics(task, env)
                if a.gang is not None:
                    task.run = GangRun(
                        a,
                        cwd=task.dir.work,
                        env=env,
                        on_line=task.logs.add,
                        kill_grace_seconds=self.config.kill_grace_seconds,
                    )
                else:
                    task.run = CommandRun(
                        a.spec,
                        cwd=task.dir.work,
                        env=env,
                        on_line=task.logs.add,
                        kill_grace_seconds=self.config.kill_grace_seconds,
                    )
            if task.cancel_reason is not None:
                task.run.cancel(task.cancel_reason)
            return await task.run.run()

    async def _run_gang_call(self, task: _Task, data: bytes) -> RunOutcome:
        """A distributed function: every rank makes the call (:mod:`.rank_call`);
        global rank 0's outcome is the answer, sent back by node 0."""
        a = task.assignment
        assert task.dir is not None and a.gang is not None and a.spec.function is not None
        root = task.dir.root
        await asyncio.to_thread((root / "call.payload").write_bytes, data)
        argv = [sys.executable, "-m", "gpulayer.worker.rank_call", str(root / "call.payload")]
        spec = a.spec.model_copy(update={"command": argv, "shell": None, "function": None})
        env = {**task_env(a, task.dir.artifacts), "GPULAYER_CALL_DIR": str(root)}
        self._follow_metrics(task, env)
        run = task.run = GangRun(
            a.model_copy(update={"spec": spec}),
            cwd=task.dir.work,
            env=env,
            on_line=task.logs.add,
            kill_grace_seconds=self.config.kill_grace_seconds,
        )
        if task.cancel_reason is not None:
            run.cancel(task.cancel_reason)
        out = await run.run()
        answer = None
        if out.state == "succeeded" and a.gang.node_rank == 0:
            answer = root / rank_call.OUTCOME_FILE
        elif out.state == "failed" and any(root.glob(rank_call.RAISED_PREFIX + "*")):
            # The function raised (not a crash): no retry unless asked; the failing
            # rank's exception is the answer when it was one of this node's.
            out = dataclasses.replace(out, retry=a.spec.function.retry_exceptions)
            if run.failed_rank is not None:
                answer = rank_call.raised_file(root, run.failed_rank)
        if answer is not None and answer.exists():
            out = dataclasses.replace(out, result=await asyncio.to_thread(answer.read_bytes))
        return out

    async def _run_kernel_task(self, task: _Task) -> RunOutcome:
        """A cell or session task, in a headless kernel (:mod:`gpulayer.worker.kernels`)."""
        a = task.assignment
        log.debug("task %s (job %s, %s) started", a.task_id, a.job_id, a.spec.kind)
        cell = a.spec.cell
        if cell is not None and cell.session and not (cell.push or cell.push_blob or cell.pull):
            # A plain cell in a session touches no files: skip its folder (latency).
            task.run = CellTaskRun(self._kernels, a, env={}, cwd=Path(), scratch=Path(),
                               on_line=task.logs.add)  # fmt: skip
            if task.cancel_reason is not None:
                task.run.cancel(task.cancel_reason)
            return await task.run.run()
        task.dir = await asyncio.to_thread(TaskDir.create, self.data_dir / "tasks", a.task_id)
        env = task_env(a, task.dir.artifacts)
        if a.spec.session is not None:
            task.run = SessionRun(
                self._kernels, a, env=env, cwd=task.dir.work, on_line=task.logs.add
            )
        else:
            assert cell is not None
            try:
                push = cell.push
                if cell.push_blob is not None:
                    push = await self._blob(cell.push_blob)
            except GpulayerError as e:
                task.logs.add(c.LogStream.system, str(e), _now())
                return RunOutcome("failed", None, str(e))
            task.run = CellTaskRun(
                self._kernels, a, env=env, cwd=task.dir.work, scratch=task.dir.root,
                on_line=task.logs.add, push=push,
            )  # fmt: skip
        if task.cancel_reason is not None:
            task.run.cancel(task.cancel_reason)
        return await task.run.run()

    async def _deliver(self, task: _Task, outcome: RunOutcome) -> None:
        """Flush logs, upload artifacts, complete: in this order, so that a client
        that sees the task ended also sees all its output."""
        await task.logs.flush()
        if task.metrics is not None:
            await task.metrics.flush()
        if task.dir is not None:
            for name, path in await _quick(task, task.dir.artifact_files):
                if task.abandoned:
                    return
                try:
                    await self._upload_artifact(task, name, path)
                except OSError as e:  # the file went away or cannot be read
                    task.logs.add(c.LogStream.system, f"artifact {name!r} not kept: {e}", _now())
            await task.logs.flush()  # lines about artifacts that were not kept
        if task.abandoned:
            return
        blob = None
        if outcome.result is not None and len(outcome.result) > c.INLINE_BYTES:
            blob = await self._upload_result(task, outcome.result)
            if blob is None:
                return
        resp = await self._call(
            "POST", f"tasks/{task.id}/complete", body=outcome.completion(result_blob=blob)
        )
        if resp.is_success:
            c.Task.model_validate(resp.json())
        else:
            log.warning("completion of task %s refused: %s", task.id, _describe(resp))

    def _follow_metrics(self, task: _Task, env: dict[str, str]) -> None:
        """Point the task's ``$GPULAYER_METRICS_FILE`` into its directory and follow it."""
        assert task.dir is not None
        path = task.dir.root / "metrics.jsonl"
        env[METRICS_FILE_ENV] = str(path)
        task.metrics = TrainingMetricsFollower(path, functools.partial(self._send_metrics, task.id))
        task.metrics_loop = asyncio.create_task(task.metrics.run(), name=f"metrics-{task.id}")

    async def _send_metrics(self, task_id: str, batch: c.MetricBatch) -> c.MetricAck | None:
        resp = await self._call("POST", f"tasks/{task_id}/metrics", body=batch)
        if resp.is_success:
            return c.MetricAck.model_validate(resp.json())
        log.warning("metrics of task %s refused: %s", task_id, _describe(resp))
        return None

    async def _send_logs(self, task_id: str, batch: c.LogBatch) -> c.LogAck | None:
        resp = await self._call("POST", f"tasks/{task_id}/logs", body=batch)
        if resp.is_success:
            return c.LogAck.model_validate(resp.json())
        if task := self._tasks.get(task_id):
            task.abandon(f"logs refused: {_describe(resp)}")
        return None

    async def _upload_result(self, task: _Task, result: bytes) -> str | None:
        """PUT a large function result; its sha256, or None when the task was refused."""
        headers = {"Content-Type": "application/octet-stream"}
        resp = await self._call("PUT", f"tasks/{task.id}/result", content=result, headers=headers)
        if resp.is_success:
            return c.BlobRef.model_validate(resp.json()).sha256
        task.abandon(f"result upload refused: {_describe(resp)}")
        return None

    async def _upload_artifact(self, task: _Task, name: str, path: Path) -> None:
        """PUT one file. A transport error or 5xx while the control plane is otherwise
        up (a body over the server's limit closes the connection) counts as a strike;
        after a few the file is given up rather than retried forever."""
        route = f"tasks/{task.id}/artifacts/" + "/".join(quote(s, safe="") for s in name.split("/"))
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(path.stat().st_size),
        }
        strikes, delay = 0, _BACKOFF_START_SECONDS
        while True:
            try:
                resp = await self._call(
                    "PUT", route, content=lambda: _file_chunks(path), headers=headers, retry=False
                )
                if resp.status_code < 500:
                    break
                problem = _describe(resp)
            except httpx.TransportError as e:
                problem = f"{type(e).__name__}: {e}"
            if not await self._heartbeat(retry=False):
                await self._heartbeat()  # an outage: wait for the server, no strike
            else:
                strikes += 1
                if strikes >= _ARTIFACT_STRIKES:
                    task.logs.add(
                        c.LogStream.system, f"artifact {name!r} not kept: {problem}", _now()
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_CAP_SECONDS)
        if resp.status_code in (403, 404, 409):
            task.abandon(f"artifact upload refused: {_describe(resp)}")
        elif not resp.is_success:
            task.logs.add(
                c.LogStream.system, f"artifact {name!r} not kept: {_describe(resp)}", _now()
            )

    async def _blob(self, sha256: str) -> bytes:
        """A bundle by its sha256, from the cache under ``data_dir/blobs`` or the server.

        Raises
        ------
        NotFound, ValidationError
            If the control plane does not have it, or sends something else.
        """
        path = self.data_dir / "blobs" / sha256
        async with self._blob_locks.setdefault(sha256, asyncio.Lock()):
            if path.is_file():
                return await asyncio.to_thread(path.read_bytes)
            resp = await self._call("GET", f"blobs/{sha256}")
            if resp.status_code == 404:
                raise NotFound(f"bundle {sha256} is not on the control plane", field="bundle")
            if not resp.is_success:
                raise _error(resp, f"cannot download bundle {sha256}")
            data = resp.content
            if await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest()) != sha256:
                raise ValidationError(f"bundle {sha256} arrived corrupt", field="bundle")
            await asyncio.to_thread(_write_atomically, path, data)
            return data

    # ---------------------------------------------------------------- HTTP

    async def _call(
        self, method: str, route: str, *, worker_route: bool = False, **kw: Unpack[_Request]
    ) -> httpx.Response:
        """A request with the worker token; registers again when the server forgot us.

        ``worker_route`` routes are relative to ``workers/{worker_id}/``, resolved at
        every try because a new registration may bring a new id.
        """
        delay = 0.0
        while True:
            seen = self._registrations
            path = f"workers/{self._worker_id}/{route}" if worker_route else route
            resp = await self._send(method, path, token=self._worker_token, **kw)
            if resp.status_code != 401 and not (worker_route and resp.status_code == 404):
                return resp
            log.warning(
                "control plane does not know worker %s (HTTP %d); registering again",
                self.name,
                resp.status_code,
            )
            await asyncio.sleep(delay)  # only a server that keeps forgetting us waits here
            delay = min(max(delay * 2, _BACKOFF_START_SECONDS), _BACKOFF_CAP_SECONDS)
            await self._register_again(seen)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        token: str,
        body: pydantic.BaseModel | None = None,
        params: dict[str, int] | None = None,
        content: Content | None = None,
        headers: dict[str, str] | None = None,
        retry: bool = True,
    ) -> httpx.Response:
        """One request; with ``retry``, transport errors and 5xx answers are retried
        with capped backoff until they stop, warning once per outage."""
        all_headers = {"Authorization": f"Bearer {token}", **(headers or {})}
        delay, warned = _BACKOFF_START_SECONDS, False
        while True:
            try:
                resp = await self._http.request(
                    method,
                    self._base + path,
                    params=params,
                    headers=all_headers,
                    json=None if body is None else body.model_dump(mode="json"),
                    content=content() if callable(content) else content,
                )
            except httpx.TransportError as e:
                pin = tls.mismatch_in(e)
                if pin is not None:  # not an outage: never retried, nothing was sent
                    raise CertificateMismatch(tls.mismatch_message(self.config.url, pin)) from e
                if not retry:
                    raise
                problem = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 500:
                    if self._outage_since is not None:
                        outage = asyncio.get_running_loop().time() - self._outage_since
                        log.info("control plane is back after %.1fs", outage)
                        self._outage_since = None
                    return resp
                if not retry:
                    return resp
                problem = f"HTTP {resp.status_code}"
            if not warned and self._outage_since is None:
                log.warning("control plane unavailable (%s); retrying until it is back", problem)
                self._outage_since = asyncio.get_running_loop().time()
            warned = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_CAP_SECONDS)


async def run_agent(config: AgentConfig, stop: asyncio.Event | None = None) -> None:
    """Register, heartbeat, acquire and run tasks until ``stop`` is set (or, when
    ``stop`` is None, until SIGINT or SIGTERM sets it).

    Raises
    ------
    ValueError
        If ``GPULAYER_SIMULATED_GPUS`` is malformed.
    GpulayerError
        If the worker cannot be described or the first registration is rejected.
    """
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError) as e:  # not the main thread
                log.debug("cannot handle %s: %s", sig.name, e)
    timeout = httpx.Timeout(_ACQUIRE_WAIT_SECONDS + 15.0, connect=5.0)
    try:
        verify = tls.verify_for(config.url, config.fingerprint)
        async with httpx.AsyncClient(timeout=timeout, verify=verify) as http:
            agent = Agent(config, http)
            serving = asyncio.create_task(agent.serve(), name="gpulayer-worker")
            stopping = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                serving.cancel()
                try:
                    with contextlib.suppress(asyncio.CancelledError):
                        await serving  # re-raises a failed first registration
                finally:
                    await agent.shutdown()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    log.info("worker stopped")


def main(config: AgentConfig) -> int:
    """Run the agent until SIGINT or SIGTERM; the exit code of ``gpulayer join``."""
    asyncio.run(run_agent(config))
    return 0


async def _quick(task: _Task, fn: Callable[[], T]) -> T:
    """Blocking file work for a task: inline for a function call, whose directory
    is nearly always empty (a thread hand-off costs more than the work), else in
    a thread."""
    if task.assignment.spec.function is not None:
        return fn()
    return await asyncio.to_thread(fn)


def advertise_address(url: str) -> str:
    """The address other workers reach this one at: 127.0.0.1 when the control plane
    is on this machine, else the local IP this machine uses to reach it."""
    host = httpx.URL(url).host or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        if any(ipaddress.ip_address(i[4][0]).is_loopback for i in infos):
            return "127.0.0.1"
        with socket.socket(infos[0][0], socket.SOCK_DGRAM) as s:
            s.connect((infos[0][4][0], 9))  # a UDP connect sends nothing
            return str(s.getsockname()[0])
    except (OSError, ValueError):
        return socket.gethostname()


def _now() -> datetime:
    return datetime.now(UTC)


def _because(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


def _describe(resp: httpx.Response) -> str:
    """``HTTP 413 too_large: message`` from an error answer, tolerant of odd bodies."""
    try:
        err = c.ErrorBody.model_validate(resp.json())
    except ValueError:  # not JSON, or not an ErrorBody (pydantic errors are ValueErrors)
        return f"HTTP {resp.status_code}"
    return f"HTTP {resp.status_code} {err.code}: {err.message}"


def _error(resp: httpx.Response, what: str) -> GpulayerError:
    """The domain error an error answer stands for."""
    try:
        body = c.ErrorBody.model_validate(resp.json())
    except ValueError:
        return GpulayerError(f"{what}: HTTP {resp.status_code}")
    cls = error_for_code(body.code) or GpulayerError
    return cls(f"{what}: {body.message}", field=body.field)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, _CHUNK_BYTES):
            yield chunk


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
