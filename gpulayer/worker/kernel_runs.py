"""``cell`` and ``session`` tasks, in headless kernels (:mod:`gpulayer.worker.kernels`).

* A **session** task (:class:`SessionRun`) starts a kernel with the task's GPU
  reservation in ``CUDA_VISIBLE_DEVICES`` and keeps it in the
  :class:`~gpulayer.worker.kernels.KernelHost` under the session's name until
  the task is cancelled (the session ended or expired) or the kernel dies. It
  holds its worker slot all that time.
* A **cell** task (:class:`CellTaskRun`) runs in its session's kernel, without a
  slot of its own, or, without a session, in a fresh kernel that is shut down
  after it. Cells of one kernel run one at a time.

Interrupt sends SIGINT through the kernel manager; the cell ends ``cancelled``
with the kernel's ``KeyboardInterrupt`` relayed, and a session stays usable.
A kernel that dies mid-cell fails the cell with a clear message, and a dead
session's task ends ``failed``.
"""

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulayer import contracts as c
from gpulayer.worker.kernels import Kernel, KernelDied, KernelHost, encode, session_key
from gpulayer.worker.runs import HoldingLineCallback, LineCallback, RunOutcome, wake
from gpulayer.worker.workspace import read_owned, write_for_task

_INTERRUPT_GRACE_SECONDS = 5.0  # a cancelled session cell gets this long to stop
_SESSION_CHECK_SECONDS = 1.0  # how often a session's kernel is checked for being alive


class _IopubRelay:
    """Turns kernel messages into the task's ``iopub`` lines."""

    def __init__(self, on_line: HoldingLineCallback) -> None:
        self.on_line = on_line

    def __call__(self, msg: c.KernelMessage, *, last: bool = False) -> None:
        """Relay ``msg``; the ``last`` one (a session cell's ``execute_reply``) is held
        so that it rides the task's completion: one request fewer per cell, and the
        client reads the reply with the end (ADR 0143)."""
        now = datetime.now(UTC)
        for text in encode(msg):
            self.on_line(c.LogStream.iopub, text, now, hold=last)


class CellTaskRun:
    """One ``cell`` task: in its session's kernel, or in a fresh one."""

    def __init__(
        self,
        host: KernelHost,
        assignment: c.Assignment,
        *,
        env: Mapping[str, str],
        cwd: Path,
        scratch: Path,
        on_line: HoldingLineCallback,
        push: bytes | None = None,
    ) -> None:
        assert assignment.spec.cell is not None
        self._push = push
        self._host = host
        self._a = assignment
        self._cell = assignment.spec.cell
        self._env = env
        self._cwd = cwd
        self._scratch = scratch  # push/pull files (the task's own folder)
        self._relay = _IopubRelay(on_line)
        self._on_line = on_line
        self._kernel: Kernel | None = None
        self._stop = asyncio.Event()
        self._stop_reason: str | None = None
        self._woken: asyncio.Future[None] | None = None  # _guarded's wait, while it waits
        self._interrupted = False
        self._signal: asyncio.Future[None] | None = None  # an interrupt on its way

    @property
    def pid(self) -> int | None:
        """The kernel running the cell."""
        return None if self._kernel is None else self._kernel.pid

    def cancel(self, reason: str) -> None:
        """Stop the cell: interrupt a session's kernel, shut a fresh one down."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop.set()
        wake(self._woken)

    def interrupt(self) -> None:
        """SIGINT the kernel; the cell ends ``cancelled`` once the kernel says so."""
        self._interrupted = True
        if self._kernel is not None:
            self._signal = asyncio.ensure_future(self._kernel.interrupt())

    async def run(self) -> RunOutcome:
        """Run the cell; never raises for what the cell does."""
        name = self._cell.session
        if name is not None:
            kernel = await self._host.kernel(session_key(self._a, name))
            if kernel is None:
                return self._fail(f"session {name!r} is not running on this worker")
        else:
            kernel = Kernel(self._env, self._cwd, worker_only=True)
            try:
                await kernel.start()
            except KernelDied as e:
                return self._fail(str(e))
        try:
            async with kernel.lock:
                self._kernel = kernel
                if self._stop.is_set():
                    return RunOutcome("cancelled", None, self._stop_reason)
                if self._interrupted:  # an interrupt that came before the kernel did
                    return RunOutcome("cancelled", None, "interrupted")
                return await self._guarded(kernel, fresh=name is None)
        finally:
            self._kernel = None
            if name is None:
                await kernel.shutdown()

    async def _guarded(self, kernel: Kernel, *, fresh: bool) -> RunOutcome:
        """The cell under its timeout and cancel.

        One future wakes it: the work's end, :meth:`cancel` or the timeout (no task
        waiting on the stop event beside the work, as ``asyncio.wait`` would need:
        two tasks and their turns of the loop on every cell)."""
        loop = asyncio.get_running_loop()
        work = asyncio.create_task(self._steps(kernel))
        woken = self._woken = loop.create_future()
        work.add_done_callback(lambda _: wake(woken))
        timeout = self._a.spec.timeout
        timer = None if timeout is None else loop.call_later(timeout, wake, woken)
        if self._stop.is_set():  # before it began to wait
            wake(woken)
        try:
            await woken
        finally:
            self._woken = None
            if timer is not None:
                timer.cancel()
        if work.done():
            return work.result()
        # Timed out or cancelled: interrupt, let the kernel relay its KeyboardInterrupt.
        if fresh:
            work.cancel()
        else:
            await kernel.interrupt()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(work), _INTERRUPT_GRACE_SECONDS)
            if not work.done():
                work.cancel()  # a kernel deaf to SIGINT: its later output is dropped
        with contextlib.suppress(asyncio.CancelledError, KernelDied):
            await work
        if self._stop.is_set():
            return RunOutcome("cancelled", None, self._stop_reason)
        return RunOutcome("timed_out", None, f"timed out after {timeout:g} s")

    async def _steps(self, kernel: Kernel) -> RunOutcome:
        """Push, run, pull; then the ``execute_reply`` line."""
        cell = self._cell
        try:
            if self._push is not None:
                path = self._scratch / "push.payload"
                await asyncio.to_thread(write_for_task, path, self._push)
                reply = await kernel.execute(_call("push", str(path), "globals()"), self._relay,
                                             silent=True)  # fmt: skip
                if reply.get("status") != "ok":
                    return self._replied(reply, "push")
            reply = await kernel.execute(cell.source, self._relay)
            result = None
            if reply.get("status") == "ok" and cell.pull:
                path = self._scratch / "pull.payload"
                pulled = await kernel.execute(
                    _call("pull", str(path), "globals()", repr(list(cell.pull))),
                    self._relay,
                    silent=True,
                )
                if pulled.get("status") != "ok":
                    return self._replied(pulled, "pull")
                result = await asyncio.to_thread(read_owned, path)
        except KernelDied as e:
            return self._fail(str(e))
        except OSError as e:  # push.payload already there, or pull.payload not the task's
            return self._fail(f"cannot exchange variables with the kernel: {e}")
        return self._replied(reply, None, result)

    def _replied(
        self, reply: dict[str, Any], step: str | None, result: bytes | None = None
    ) -> RunOutcome:
        """The outcome of a kernel reply, after relaying it as ``execute_reply``."""
        status = reply.get("status", "error")
        keys = ("status", "execution_count", "ename", "evalue")
        content: dict[str, Any] = {k: reply[k] for k in keys if k in reply}
        # In a session the reply rides the completion, which follows at once; a fresh
        # kernel's cell ends after its kernel's shutdown: its reply goes now.
        last = self._cell.session is not None
        self._relay(c.KernelMessage(msg_type="execute_reply", content=content), last=last)
        if status == "ok":
            return RunOutcome("succeeded", 0, None, result=result)
        what = f"{reply.get('ename', 'Error')}: {reply.get('evalue', '')}".rstrip(": ")
        if reply.get("ename") == "KeyboardInterrupt" or status == "aborted":
            return RunOutcome("cancelled", None, "interrupted" if self._interrupted else what)
        where = f" (in --{step})" if step else ""
        return RunOutcome("failed", 1, f"raised {what}{where}", retry=False)

    def _fail(self, why: str) -> RunOutcome:
        self._relay(
            c.KernelMessage(
                msg_type="error",
                content={
                    "ename": "KernelError",
                    "evalue": why,
                    "traceback": [f"KernelError: {why}"],
                },
            )
        )
        reply = c.KernelMessage(msg_type="execute_reply", content={"status": "error"})
        self._relay(reply, last=self._cell.session is not None)
        return RunOutcome("failed", None, why, retry=False)


class SessionRun:
    """One ``session`` task: a kernel kept under the session's name until cancelled."""

    def __init__(
        self, host: KernelHost, assignment: c.Assignment, *, env: Mapping[str, str], cwd: Path,
        on_line: LineCallback,
    ) -> None:  # fmt: skip
        assert assignment.spec.session is not None
        self._host = host
        self._name = assignment.spec.session.name
        self._key = session_key(assignment, self._name)
        self._kernel = Kernel(env, cwd, worker_only=True)
        self._on_line = on_line
        self._stop = asyncio.Event()
        self._stop_reason: str | None = None

    @property
    def pid(self) -> int | None:
        """The session's kernel."""
        return self._kernel.pid

    def cancel(self, reason: str) -> None:
        """End the session; from now on its name is free for a new one."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop.set()
        if self._host.sessions.get(self._key) is self._kernel:
            del self._host.sessions[self._key]

    def interrupt(self) -> None:
        """Nothing to do: the session's cells are interrupted, each as its own task."""

    async def run(self) -> RunOutcome:
        """Start the kernel, serve the session, shut it down; never raises."""
        if self._key in self._host.sessions:
            why = f"session {self._name!r} already runs here"
            return RunOutcome("failed", None, why, retry=False)
        self._host.runs.add(self)
        try:
            # Its cells wait for the kernel; they hear "none will come" only from a
            # start that failed or was cancelled. Once up, this session never says it
            # again: by its end, a new session of this name may be the one awaited.
            try:
                await self._kernel.start()
            except KernelDied as e:
                self._host.started(self._key, None)
                return RunOutcome("failed", None, str(e), retry=False)
            except BaseException:
                self._host.started(self._key, None)
                raise
            self._host.sessions[self._key] = self._kernel
            self._host.started(self._key, self._kernel)
            now = datetime.now(UTC)
            self._on_line(c.LogStream.system, f"session {self._name} started", now)
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), _SESSION_CHECK_SECONDS)
                if not self._stop.is_set() and not await self._kernel.alive():
                    why = f"the kernel of session {self._name} died"
                    self._on_line(c.LogStream.system, why, datetime.now(UTC))
                    return RunOutcome("failed", None, why, retry=False)
            return RunOutcome("succeeded", 0, f"session ended ({self._stop_reason})")
        finally:
            self._host.runs.discard(self)
            if self._host.sessions.get(self._key) is self._kernel:
                del self._host.sessions[self._key]
            await self._kernel.shutdown()


def _call(fn: str, path: str, *args: str) -> str:
    """One hidden line that calls :mod:`gpulayer.variables` in the kernel."""
    return f"__import__('gpulayer.variables').variables.{fn}({', '.join((repr(path), *args))})"
