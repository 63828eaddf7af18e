"""Headless Jupyter kernels on a worker: ``cell`` and ``session`` tasks.

A cell runs in a real ipykernel started with jupyter_client's
``AsyncKernelManager`` (transport ``ipc``: no ports, no unencrypted-TCP
warning), so what it shows is real Jupyter messages. Each iopub message of the
cell (``stream``, ``display_data``, ``update_display_data``,
``execute_result``, ``error``, ``clear_output``) becomes one ``iopub`` log line
holding a :class:`~gpulayer.contracts.KernelMessage`, in the order the kernel
sent them; after them comes gpulayer's own ``execute_reply`` line. The lines
ride the task's :class:`~gpulayer.worker.logs.LogShipper`, so they are
numbered, batched, resent and followed like any output (docs/adr/0040).

* A **session** task (:class:`SessionRun`) starts a kernel with the task's GPU
  reservation in ``CUDA_VISIBLE_DEVICES`` and keeps it in the
  :class:`KernelHost` under the session's name until the task is cancelled
  (the session ended or expired) or the kernel dies. It holds its worker slot
  all that time.
* A **cell** task (:class:`CellTaskRun`) runs in its session's kernel, without a
  slot of its own, or, without a session, in a fresh kernel that is shut down
  after it. Cells of one kernel run one at a time.

Interrupt sends SIGINT through the kernel manager; the cell ends ``cancelled``
with the kernel's ``KeyboardInterrupt`` relayed, and a session stays usable.
A kernel that dies mid-cell fails the cell with a clear message, and a dead
session's task ends ``failed``.

``jupyter_client`` is imported on first use, so a worker that never runs a
cell does not pay for it.
"""

import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulayer import contracts as c
from gpulayer.worker.runs import LineCallback, RunOutcome

log = logging.getLogger(__name__)


RELAYED = frozenset(
    {"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"}
)
_LINE_CHARS = 60_000  # below LogEntry's 65536, so the shipper never splits a piece again
_MAX_MESSAGE_CHARS = 32 * 1024 * 1024  # a bigger output is replaced by a note
_START_TIMEOUT_SECONDS = 60.0
_POLL_SECONDS = 0.5  # how often a silent kernel is checked for being alive
_INTERRUPT_GRACE_SECONDS = 5.0  # a cancelled session cell gets this long to stop


class KernelDied(Exception):
    """The kernel process ended while it was running code."""


def encode(msg: c.KernelMessage) -> list[str]:
    """The ``iopub`` log lines of one message (several when it is long)."""
    text = msg.model_dump_json()
    if len(text) > _MAX_MESSAGE_CHARS:
        note = c.KernelMessage(
            msg_type="stream",
            content={
                "name": "stderr",
                "text": f"[gpulayer: a {msg.msg_type} of {len(text) >> 20} MiB was not relayed]\n",
            },
        )
        text = note.model_dump_json()
    if len(text) <= _LINE_CHARS:
        return [text]
    parts = [text[i : i + _LINE_CHARS] for i in range(0, len(text), _LINE_CHARS)]
    return [c.FRAGMENT + p for p in parts[:-1]] + [parts[-1]]


class Kernel:
    """One headless ipykernel and its client."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self.env = dict(env)
        self.cwd = cwd
        self.lock = asyncio.Lock()  # one execution at a time: one iopub reader
        self._dir = Path(tempfile.mkdtemp(prefix="glk-"))  # short: ipc paths are limited
        self._km: Any = None
        self._kc: Any = None

    @property
    def pid(self) -> int | None:
        """The kernel process (for per-task telemetry)."""
        proc = getattr(getattr(self._km, "provisioner", None), "process", None)
        return getattr(proc, "pid", None)

    async def start(self) -> None:
        """Start the kernel and wait until it answers.

        Raises
        ------
        KernelDied
            If it exits or does not answer within 60 s.
        """
        from jupyter_client.kernelspec import KernelSpec
        from jupyter_client.manager import AsyncKernelManager

        # The worker's own interpreter, whatever kernelspecs the machine has installed.
        spec = KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="gpulayer",
            language="python",
        )
        km = AsyncKernelManager(transport="ipc", connection_file=str(self._dir / "kernel.json"))
        km._kernel_spec = spec  # jupyter_client takes a spec from disk only, else this
        self._km = km
        try:
            await km.start_kernel(env=self.env, cwd=str(self.cwd))
            kc = km.client()
            kc.start_channels()
            self._kc = kc
            await kc.wait_for_ready(timeout=_START_TIMEOUT_SECONDS)
        except (RuntimeError, TimeoutError) as e:
            await self.shutdown()
            raise KernelDied(f"the kernel did not start: {e}") from e

    async def alive(self) -> bool:
        """Whether the kernel process still runs."""
        return self._km is not None and bool(await self._km.is_alive())

    async def execute(
        self, code: str, on_message: Callable[[c.KernelMessage], None], *, silent: bool = False
    ) -> dict[str, Any]:
        """Run ``code``; every relayed message goes to ``on_message`` in order.

        Returns the ``execute_reply`` content once the kernel is idle again.

        Raises
        ------
        KernelDied
            If the kernel process ends before the reply.
        """
        kc = self._kc
        msg_id = kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False)
        while True:  # iopub until this request's `idle`: then every output is in
            msg = await self._next(kc.get_iopub_msg)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue  # a previous, abandoned request's leftovers
            kind = msg["msg_type"]
            if kind == "status" and msg["content"].get("execution_state") == "idle":
                break
            if kind in RELAYED:
                on_message(
                    c.KernelMessage(
                        msg_type=kind,
                        content=msg["content"],
                        metadata=msg.get("metadata") or {},
                        transient=msg["content"].pop("transient", None) or {},
                    )
                )
        while True:  # the reply (it may come before or after `idle`)
            reply = await self._next(kc.get_shell_msg)
            if reply["parent_header"].get("msg_id") == msg_id:
                return dict(reply["content"])

    async def _next(self, get: Callable[..., Any]) -> dict[str, Any]:
        while True:
            try:
                return await get(timeout=_POLL_SECONDS)  # type: ignore[no-any-return]
            except Exception as e:  # queue.Empty (no message yet), or a closed channel
                if not await self.alive():
                    raise KernelDied(self._death()) from e

    def _death(self) -> str:
        proc = getattr(getattr(self._km, "provisioner", None), "process", None)
        code = getattr(proc, "returncode", None)
        how = f" (exit code {code})" if code is not None else ""
        return f"the remote kernel died{how} while running the cell"

    async def interrupt(self) -> None:
        """SIGINT the kernel (a ``KeyboardInterrupt`` in the running cell)."""
        if await self.alive():
            await self._km.interrupt_kernel()

    async def shutdown(self) -> None:
        """Stop the kernel (gracefully, then by force) and remove its files."""
        try:
            if self._kc is not None:
                self._kc.stop_channels()
            if self._km is not None and await self._km.is_alive():
                await self._km.shutdown_kernel(now=False)
        except Exception:  # a kernel that is gone already, or will not die politely
            log.debug("kernel shutdown", exc_info=True)
            with contextlib.suppress(Exception):
                await self._km.shutdown_kernel(now=True)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


class KernelHost:
    """The worker's sessions: their kernels, by session name."""

    def __init__(self) -> None:
        self.sessions: dict[str, Kernel] = {}  # the kernels that are up, by session name
        self.runs: set[SessionRun] = set()  # the session tasks running here
        # Sessions assigned here whose kernel is not up yet: cells placed meanwhile wait.
        self._coming: dict[str, asyncio.Future[Kernel | None]] = {}

    def expect(self, name: str) -> None:
        """A session was assigned to this worker: its cells wait for its kernel."""
        if name not in self._coming or self._coming[name].done():
            self._coming[name] = asyncio.get_running_loop().create_future()

    def started(self, name: str, kernel: Kernel | None) -> None:
        """Session ``name``'s kernel is up (or, None, will not come): its cells go on."""
        fut = self._coming.pop(name, None)
        if fut is not None and not fut.done():
            fut.set_result(kernel)

    async def kernel(self, name: str) -> Kernel | None:
        """The kernel of session ``name`` (waiting while it starts), or None."""
        if name in self.sessions:
            return self.sessions[name]
        fut = self._coming.get(name)
        return None if fut is None else await asyncio.shield(fut)

    async def close(self) -> None:
        """End every session (the agent is stopping)."""
        for run in list(self.runs):
            run.cancel("worker shutting down")
        kernels = list(self.sessions.values())
        self.sessions.clear()
        await asyncio.gather(*(k.shutdown() for k in kernels), return_exceptions=True)


class _IopubRelay:
    """Turns kernel messages into the task's ``iopub`` lines."""

    def __init__(self, on_line: LineCallback) -> None:
        self.on_line = on_line

    def __call__(self, msg: c.KernelMessage) -> None:
        now = datetime.now(UTC)
        for text in encode(msg):
            self.on_line(c.LogStream.iopub, text, now)


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
        on_line: LineCallback,
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

    def interrupt(self) -> None:
        """SIGINT the kernel; the cell ends ``cancelled`` once the kernel says so."""
        self._interrupted = True
        if self._kernel is not None:
            self._signal = asyncio.ensure_future(self._kernel.interrupt())

    async def run(self) -> RunOutcome:
        """Run the cell; never raises for what the cell does."""
        name = self._cell.session
        if name is not None:
            kernel = await self._host.kernel(name)
            if kernel is None:
                return self._fail(f"session {name!r} is not running on this worker")
        else:
            kernel = Kernel(self._env, self._cwd)
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
        """The cell under its timeout and cancel."""
        work = asyncio.create_task(self._steps(kernel))
        stop = asyncio.create_task(self._stop.wait())
        timeout = self._a.spec.timeout
        try:
            done, _ = await asyncio.wait(
                {work, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stop.cancel()
        if work in done:
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
                await asyncio.to_thread(path.write_bytes, self._push)
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
                result = await asyncio.to_thread(path.read_bytes)
        except KernelDied as e:
            return self._fail(str(e))
        return self._replied(reply, None, result)

    def _replied(
        self, reply: dict[str, Any], step: str | None, result: bytes | None = None
    ) -> RunOutcome:
        """The outcome of a kernel reply, after relaying it as ``execute_reply``."""
        status = reply.get("status", "error")
        keys = ("status", "execution_count", "ename", "evalue")
        content: dict[str, Any] = {k: reply[k] for k in keys if k in reply}
        self._relay(c.KernelMessage(msg_type="execute_reply", content=content))
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
        self._relay(c.KernelMessage(msg_type="execute_reply", content={"status": "error"}))
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
        self._kernel = Kernel(env, cwd)
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
        if self._host.sessions.get(self._name) is self._kernel:
            del self._host.sessions[self._name]

    def interrupt(self) -> None:
        """Nothing to do: the session's cells are interrupted, each as its own task."""

    async def run(self) -> RunOutcome:
        """Start the kernel, serve the session, shut it down; never raises."""
        if self._name in self._host.sessions:
            why = f"session {self._name!r} already runs here"
            return RunOutcome("failed", None, why, retry=False)
        self._host.runs.add(self)
        try:
            try:
                await self._kernel.start()
            except KernelDied as e:
                self._host.started(self._name, None)
                return RunOutcome("failed", None, str(e), retry=False)
            self._host.sessions[self._name] = self._kernel
            self._host.started(self._name, self._kernel)
            now = datetime.now(UTC)
            self._on_line(c.LogStream.system, f"session {self._name} started", now)
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), _POLL_SECONDS * 2)
                if not self._stop.is_set() and not await self._kernel.alive():
                    why = f"the kernel of session {self._name} died"
                    self._on_line(c.LogStream.system, why, datetime.now(UTC))
                    return RunOutcome("failed", None, why, retry=False)
            return RunOutcome("succeeded", 0, f"session ended ({self._stop_reason})")
        finally:
            self._host.runs.discard(self)
            self._host.started(self._name, None)  # cancelled while starting
            if self._host.sessions.get(self._name) is self._kernel:
                del self._host.sessions[self._name]
            await self._kernel.shutdown()


def _call(fn: str, path: str, *args: str) -> str:
    """One hidden line that calls :mod:`gpulayer.variables` in the kernel."""
    return f"__import__('gpulayer.variables').variables.{fn}({', '.join((repr(path), *args))})"
