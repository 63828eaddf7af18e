"""Run and deliver one task at a time, each in its own pipeline::

    start      log shipper (and result-part shipper), record   (the assignment arrived)
    run        slot -> Run from the launcher -> cancel guard -> run to its outcome
    deliver    flush result parts and training metrics -> upload artifacts ->
               upload a large result -> complete, with the log lines not sent yet
    clean up   remove the task's folder, forget the task

Delivery keeps this order, so that a client that sees the task ended also sees
all its output. A task the control plane gave up on (abandoned) delivers
nothing more; a task released because the worker stops ends ``lost``, so the
control plane retries it.

An artifact that cannot be stored never lets its task end plainly ``succeeded``
(docs/adr/0088): a full or read-only control plane (507/503) is retried with
backoff for ``GPULAYER_STORAGE_RETRY_SECONDS`` (300 s), an outage until the
control plane is back; then the task ends ``failed``, not retried, with a reason
naming each artifact and why ("artifact 'model.pt' not stored: HTTP 507
storage_full: the control plane's disk is full (...)").
"""

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import quote

import httpx

from gpulayer import contracts as c
from gpulayer import transfer
from gpulayer.errors import GpulayerError
from gpulayer.worker.environments import EnvBuildFailed
from gpulayer.worker.launch import Launcher
from gpulayer.worker.lease import Lease
from gpulayer.worker.logs import LogShipper
from gpulayer.worker.parts import PartShipper
from gpulayer.worker.record import TaskRecord
from gpulayer.worker.runs import RunOutcome
from gpulayer.worker.uplink import BACKOFF_CAP_SECONDS, BACKOFF_START_SECONDS, Uplink, describe
from gpulayer.worker.workspace import open_owned

log = logging.getLogger(__name__)

_ARTIFACT_STRIKES = 3  # failed uploads of one file, server otherwise up, before giving up
_CELL_BATCH_SECONDS = 0.002
#: How long an artifact upload refused for lack of storage (503, 507) is retried.
DEFAULT_STORAGE_RETRY_SECONDS = 300.0
_STORAGE_STATUSES = (503, 507)


def configured_storage_retry_seconds() -> float:
    """``GPULAYER_STORAGE_RETRY_SECONDS``, else :data:`DEFAULT_STORAGE_RETRY_SECONDS`."""
    raw = os.environ.get("GPULAYER_STORAGE_RETRY_SECONDS", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_STORAGE_RETRY_SECONDS
    except ValueError:
        log.warning("GPULAYER_STORAGE_RETRY_SECONDS=%r is not a number; using 300", raw)
        return DEFAULT_STORAGE_RETRY_SECONDS


class Heartbeat(Protocol):
    """Send one heartbeat; True when the control plane answered it."""

    async def __call__(self, *, retry: bool = True) -> bool: ...


class Pipeline:
    """The worker's tasks, from assignment to delivered result.

    Parameters
    ----------
    uplink
        Where logs, metrics, artifacts, results and completions go.
    launcher
        Makes each task's run.
    slots
        Tasks that run at once (a cell in a session uses its session's slot).
    log_batch_seconds
        How long to gather log lines into one batch.
    heartbeat
        Tells an outage (wait, no strike) from a failing artifact upload.
    lease
        The worker's lease: a run that ends after it may be lost ends ``lost``.
    storage_retry_seconds
        How long an artifact refused for lack of storage is retried (default:
        :func:`configured_storage_retry_seconds`).
    """

    def __init__(
        self,
        uplink: Uplink,
        launcher: Launcher,
        *,
        slots: int,
        log_batch_seconds: float,
        heartbeat: Heartbeat,
        lease: Lease | None = None,
        storage_retry_seconds: float | None = None,
    ) -> None:
        self.tasks: dict[str, TaskRecord] = {}  # tasks whose result is not delivered yet
        if storage_retry_seconds is None:
            storage_retry_seconds = configured_storage_retry_seconds()
        self._storage_retry_seconds = storage_retry_seconds
        self._uplink = uplink
        self._launcher = launcher
        self._slots = asyncio.Semaphore(slots)
        self._log_batch_seconds = log_batch_seconds
        self._heartbeat = heartbeat
        self._lease = lease

    def take(self, acquired: c.Acquired) -> None:
        """An acquire answer: its new assignments start first, then its cancels and
        interrupts apply, so that one of a task the same answer starts (cancelled
        between its start at submit and this answer) reaches it, not an unknown id."""
        for assignment in acquired.assignments:
            if assignment.task_id not in self.tasks:  # a re-sent assignment runs once
                self.start(assignment)
        self.cancel(acquired.cancel)
        for task_id in acquired.interrupt:
            if task := self.tasks.get(task_id):
                task.interrupt()

    def cancel(self, task_ids: list[str]) -> None:
        """Stop user-cancelled tasks (repeats are harmless: a cancel happens once)."""
        for task_id in task_ids:
            if task := self.tasks.get(task_id):
                task.cancel("cancelled by user")

    def start(self, assignment: c.Assignment) -> None:
        """Start the pipeline of a new assignment."""
        task_id = assignment.task_id
        batch = self._log_batch_seconds
        if assignment.spec.kind == c.JobKind.cell:  # a cell's output is watched live
            batch = min(batch, _CELL_BATCH_SECONDS)
        logs = LogShipper(task_id, functools.partial(self._send_logs, task_id), batch_seconds=batch)
        send_metrics = functools.partial(self._send_metrics, task_id)
        task = self.tasks[task_id] = TaskRecord(assignment, logs, send_metrics)
        fn = assignment.spec.function
        if fn is not None and fn.calls > 1 and assignment.gang is None:
            send = functools.partial(self._send_parts, task_id)
            task.parts = PartShipper(task_id, send)
            task.parts_loop = asyncio.create_task(task.parts.run(), name=f"parts-{task_id}")
        self._launcher.expect(assignment)
        logs.start_on_demand()  # a call that prints nothing ships nothing
        task.pipeline = asyncio.create_task(self._pipeline(task), name=f"task-{task_id}")

    async def release(self, timeout: float) -> None:
        """Stop every task, to be reported ``lost`` (so it is retried); pipelines still
        going after ``timeout`` seconds are cancelled."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.released = True
            task.cancel("worker shutting down")
        pipelines = [t.pipeline for t in tasks if t.pipeline is not None]
        if not pipelines:
            return
        _, late = await asyncio.wait(pipelines, timeout=timeout)
        for pipeline in late:
            pipeline.cancel()  # CommandRun SIGKILLs whatever is left
        await asyncio.gather(*late, return_exceptions=True)

    # ------------------------------------------------------------------ run

    async def _pipeline(self, task: TaskRecord) -> None:
        """Run one task and deliver its result; the boundary for its errors."""
        try:
            try:
                outcome = await self._run(task)
            except Exception as e:  # a task boundary: the failure becomes the task's state
                log.exception("task %s: worker error", task.id)
                outcome = RunOutcome("failed", None, f"worker error: {e!r}")
                task.logs.add(c.LogStream.system, outcome.reason or "", _now())
            if task.released and outcome.state == "cancelled":
                outcome = RunOutcome("lost", outcome.exit_code, outcome.reason)
            if outcome.state != "succeeded" and (
                task.fenced or (self._lease is not None and self._lease.overdue())
            ):
                # Stopped (or killed by the supervisor while the agent was frozen)
                # because the lease may be lost: the control plane retries it.
                task.fenced = True
                reason = task.cancel_reason or "its worker's lease ran out"
                outcome = RunOutcome("lost", outcome.exit_code, reason)
            # A call or a cell a second is no news in the worker's log (nor in the
            # control plane's); the rest is.
            quiet = task.assignment.spec.kind in (c.JobKind.function, c.JobKind.cell)
            log.log(
                logging.DEBUG if quiet else logging.INFO,
                "task %s ended: %s%s",
                task.id,
                outcome.state,
                f" ({outcome.reason})" if outcome.reason else "",
            )
            if not task.abandoned:
                await self._deliver(task, outcome)
            if task.dir is not None:
                # An empty call folder waits for its owner's next call (ADR 0145).
                # Else in a thread even for a function call: delivered already, and a
                # few rmdir take milliseconds on a busy disk, which the loop spends on
                # the next assignment meanwhile (py-spy: 44% of the worker's samples).
                # Only after a call its runner answered: nothing of it runs on.
                answered = outcome.state in ("succeeded", "failed") and not task.abandoned
                if not (answered and self._launcher.park(task)):
                    await asyncio.to_thread(task.dir.remove)
                task.dir = None
        except Exception:  # a task boundary: nothing more can be delivered
            log.exception("task %s: result not delivered", task.id)
        finally:
            task.release_env()
            if task.env_sent is not None and not task.env_sent.done():
                task.env_sent.cancel()
            task.logs.stop()  # and its loop, if it ran
            if task.parts is not None:
                task.parts.stop()
            if task.parts_loop is not None:
                task.parts_loop.cancel()
            if task.metrics_loop is not None:
                task.metrics_loop.cancel()
            if task.dir is not None:
                task.dir.remove()  # after a cancel or error; a no-op when already gone
            self.tasks.pop(task.id, None)

    async def _run(self, task: TaskRecord) -> RunOutcome:
        """Prepare the task's run and run it, in a slot of its own unless it is a cell
        in a session (its session holds the slot and the GPUs)."""
        in_session = task.assignment.spec.in_session
        async with contextlib.nullcontext() if in_session else self._slots:
            if task.cancel_reason is not None:  # cancelled while it waited for a slot
                return RunOutcome("cancelled", None, task.cancel_reason)
            try:
                run = await self._launcher.prepare(task)
            except EnvBuildFailed as e:  # retrying the same requirements would not help
                why = f"environment not built: {e}"
                task.logs.add(c.LogStream.system, why, _now())
                return RunOutcome("failed", None, why, retry=False)
            except GpulayerError as e:  # a bundle, payload or push it cannot have
                task.logs.add(c.LogStream.system, str(e), _now())
                return RunOutcome("failed", None, str(e))
            task.run = run
            if task.cancel_reason is not None:  # cancelled while it was prepared
                run.cancel(task.cancel_reason)
            elif task.interrupted:  # a cell interrupted while it was prepared
                run.interrupt()
            return await run.run()

    # -------------------------------------------------------------- deliver

    async def _deliver(self, task: TaskRecord, outcome: RunOutcome) -> None:
        """Upload result parts, metrics and artifacts, then complete with the log
        lines not sent yet: a client that sees the task ended sees all its output."""
        if task.parts is not None:
            await task.parts.flush()  # the calls it finished, even when it ends without a result
        await task.env_reported()
        if task.metrics is not None:
            await task.metrics.flush()
        if task.dir is not None:
            lost = []
            for name, path in await task.file_work(task.dir.artifact_files):
                if task.abandoned:
                    return
                problem = await self._upload_artifact(task, name, path)
                if problem is not None:
                    lost.append(f"artifact {name!r} not stored: {problem}")
                    task.logs.add(c.LogStream.system, lost[-1], _now())
            outcome = _with_lost_artifacts(outcome, lost)
        if task.abandoned:
            return
        blob = None
        if outcome.result is not None and len(outcome.result) > c.INLINE_BYTES:
            blob = await self._upload_result(task, outcome.result)
            if blob is None:
                return
        body = outcome.completion(result_blob=blob)
        body.environment = task.env_on_completion
        # The last lines ride the completion, stored before the end (ADR 0112).
        body.logs = await task.logs.take_rest()
        resp = await self._uplink.call("POST", f"tasks/{task.id}/complete", body=body)
        task.logs.taken(body.logs, resp.is_success)
        if resp.is_success:
            c.Task.model_validate(resp.json())
        else:
            log.warning("completion of task %s refused: %s", task.id, describe(resp))

    async def _send_metrics(self, task_id: str, batch: c.MetricBatch) -> c.MetricAck | None:
        resp = await self._uplink.call("POST", f"tasks/{task_id}/metrics", body=batch)
        if resp.is_success:
            return c.MetricAck.model_validate(resp.json())
        log.warning("metrics of task %s refused: %s", task_id, describe(resp))
        if resp.status_code == 409 and (task := self.tasks.get(task_id)):
            task.abandon(f"metrics refused: {describe(resp)}")  # e.g. a stale attempt
        return None

    async def _send_parts(self, task_id: str, batch: c.ResultPartBatch) -> bool:
        resp = await self._uplink.call("POST", f"tasks/{task_id}/parts", body=batch)
        if resp.is_success:
            return True
        log.warning("result parts of task %s refused: %s", task_id, describe(resp))
        if resp.status_code == 409 and (task := self.tasks.get(task_id)):
            task.abandon(f"result parts refused: {describe(resp)}")  # e.g. a stale attempt
        return False

    async def _send_logs(self, task_id: str, batch: c.LogBatch) -> c.LogAck | None:
        resp = await self._uplink.call("POST", f"tasks/{task_id}/logs", body=batch)
        if resp.is_success:
            return c.LogAck.model_validate(resp.json())
        if task := self.tasks.get(task_id):
            task.abandon(f"logs refused: {describe(resp)}")
        return None

    async def _upload_result(self, task: TaskRecord, result: bytes) -> str | None:
        """PUT a large function result; its sha256, or None when the task was refused."""
        headers = {"Content-Type": "application/octet-stream"}
        resp = await self._uplink.call(
            "PUT", f"tasks/{task.id}/result", content=result, headers=headers
        )
        if resp.is_success:
            return c.BlobRef.model_validate(resp.json()).sha256
        task.abandon(f"result upload refused: {describe(resp)}")
        return None

    async def _upload_artifact(self, task: TaskRecord, name: str, path: Path) -> str | None:
        """PUT one file, streamed; None once it is stored (or the task was abandoned),
        else why it could not be.

        A 503/507 (the control plane cannot store it now) is retried with backoff
        for ``storage_retry_seconds``; a transport error or 5xx while the control
        plane is down waits for it; one while it is otherwise up (a body over the
        server's limit closes the connection) counts as a strike, and a few strikes
        give the file up. An answer that names other content than the file's
        sha256 is a strike too.
        """
        route = f"tasks/{task.id}/artifacts/" + "/".join(quote(s, safe="") for s in name.split("/"))
        try:  # the task's own regular file: never one a link it planted points at
            f = await asyncio.to_thread(open_owned, path)
        except OSError as e:  # the file went away, or is not the task's
            return f"cannot read it ({e.strerror or e})"
        with f:
            try:
                digest = await asyncio.to_thread(transfer.digest_fileobj, f)
            except OSError as e:
                return f"cannot read it ({e.strerror or e})"
            return await self._put_artifact(task, name, route, f, digest)

    async def _put_artifact(
        self, task: TaskRecord, name: str, route: str, f: BinaryIO, digest: transfer.Digest
    ) -> str | None:
        """:meth:`_upload_artifact`'s attempts, for the open file ``f``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._storage_retry_seconds
        strikes, delay = 0, BACKOFF_START_SECONDS
        while True:
            try:
                resp = await self._uplink.call(
                    "PUT", route, content=lambda: _file_chunks(f), headers=digest.headers(),
                    retry=False,
                )  # fmt: skip
            except OSError as e:  # reading the file failed (httpx errors are not OSErrors)
                return f"cannot read it ({e.strerror or e})"
            except httpx.TransportError as e:
                problem = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code in (403, 404, 409):
                    task.abandon(f"artifact upload refused: {describe(resp)}")
                    return None
                if resp.is_success:
                    mismatch = _stored_other_content(resp, digest, name)
                    if mismatch is None:
                        return None
                    problem = mismatch
                elif resp.status_code in _STORAGE_STATUSES:
                    if loop.time() >= deadline:
                        return describe(resp)
                    log.warning("task %s: artifact %r waits: %s", task.id, name, describe(resp))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, BACKOFF_CAP_SECONDS)
                    continue
                elif resp.status_code < 500:
                    return describe(resp)  # e.g. 413: over the control plane's limit
                else:
                    problem = describe(resp)
            if not await self._heartbeat(retry=False):
                await self._heartbeat()  # an outage: wait for the server, no strike
                continue
            strikes += 1
            if strikes >= _ARTIFACT_STRIKES:
                return problem
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP_SECONDS)


def _stored_other_content(resp: httpx.Response, digest: transfer.Digest, name: str) -> str | None:
    """None when the answer confirms the file's content, else what went wrong."""
    try:
        art = c.Artifact.model_validate(resp.json())
        digest.check(art.sha256, art.size, f"artifact {name!r}")
    except (ValueError, GpulayerError) as e:  # not an Artifact, or other content
        return str(e)
    return None


def _with_lost_artifacts(outcome: RunOutcome, lost: list[str]) -> RunOutcome:
    """``outcome`` once some artifacts could not be stored: a success becomes a
    failure that retrying would not change; another end keeps its state and says
    which artifacts are missing."""
    if not lost:
        return outcome
    why = "; ".join(lost)
    if outcome.state == "succeeded":
        return dataclasses.replace(outcome, state="failed", reason=why, retry=False)
    reason = f"{outcome.reason}; {why}" if outcome.reason else why
    return dataclasses.replace(outcome, reason=reason)


def _now() -> datetime:
    return datetime.now(UTC)


async def _file_chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    """The file from its start (each attempt of an upload reads it again)."""
    await asyncio.to_thread(f.seek, 0)
    while chunk := await asyncio.to_thread(f.read, transfer.CHUNK_BYTES):
        yield chunk
