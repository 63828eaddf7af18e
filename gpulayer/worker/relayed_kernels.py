"""A gpulayer kernel on the worker: a relay session task (docs/kernels.md,
docs/adr/0125).

:class:`RelayedKernelRun` starts the kernel as a session does (a real ipykernel
with the task's GPUs in ``CUDA_VISIBLE_DEVICES``, its env and working folder),
then opens the kernel's own WebSocket to the control plane and relays its Jupyter
channels through a :class:`~gpulayer.kernel_relay.KernelEnd`, until the task is
cancelled or the kernel ends. The WebSocket is opened again when it drops while
the kernel lives (a control plane restart), with a growing pause.

A kernel that exits after a client's ``shutdown_request`` ends the task
``succeeded``; one that dies otherwise ends it ``failed`` ("the kernel died"),
which the control plane tells the Jupyter server as a dead kernel.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gpulayer import contracts as c
from gpulayer.kernel_relay import KernelEnd
from gpulayer.worker.channel import ChannelRefused, ChannelUnavailable
from gpulayer.worker.kernels import Kernel, KernelDied, KernelHost
from gpulayer.worker.runs import LineCallback, RunOutcome

log = logging.getLogger(__name__)

#: Opens the worker's end of a kernel's relay for a job id.
RelayOpener = Callable[[str], Awaitable[ClientConnection]]

_CHECK_SECONDS = 0.5  # how often the kernel is checked for being alive
_RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)  # pauses before opening the relay again


class RelayedKernelRun:
    """One relay session task: a kernel whose channels ride its own WebSocket."""

    def __init__(
        self,
        host: KernelHost,
        assignment: c.Assignment,
        *,
        env: Mapping[str, str],
        cwd: Path,
        on_line: LineCallback,
        open_relay: RelayOpener,
    ) -> None:
        self._host = host
        self._job_id = assignment.job_id
        self._kernel = Kernel(env, cwd)
        self._on_line = on_line
        self._open_relay = open_relay
        self._stop = asyncio.Event()
        self._stop_reason: str | None = None
        self._end: KernelEnd | None = None
        self._shutdown_asked = False
        self._pending: set[asyncio.Future[None]] = set()  # sends and interrupts under way

    def _later(self, work: Awaitable[None]) -> None:
        fut = asyncio.ensure_future(work)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)

    @property
    def pid(self) -> int | None:
        """The kernel process."""
        return self._kernel.pid

    def cancel(self, reason: str) -> None:
        """End the kernel (shut down from Jupyter, idle, detached too long)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop.set()

    def interrupt(self) -> None:
        """SIGINT the kernel (Jupyter interrupts with a control message instead)."""
        self._later(self._kernel.interrupt())

    async def run(self) -> RunOutcome:
        """Start the kernel, relay it, shut it down; never raises."""
        self._host.runs.add(self)
        try:
            try:
                await self._kernel.start()
            except KernelDied as e:
                return RunOutcome("failed", None, str(e), retry=False)
            self._say("kernel started; relaying its Jupyter channels")
            return await self._serve()
        finally:
            self._host.runs.discard(self)
            if self._end is not None:
                await self._end.close()
            await self._kernel.shutdown()

    def _say(self, text: str) -> None:
        self._on_line(c.LogStream.system, text, datetime.now(UTC))

    async def _serve(self) -> RunOutcome:
        """Relay over the WebSocket, opening it again while the kernel lives."""
        failures = 0
        while True:
            relay = asyncio.create_task(self._relay_once())
            watch = asyncio.create_task(self._until_ended())
            done, _ = await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
            for t in (relay, watch):
                if t not in done:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
            if watch in done:
                return watch.result()
            opened = relay.result()
            failures = 0 if opened else failures + 1
            pause = _RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), pause)

    async def _until_ended(self) -> RunOutcome:
        """The outcome once the task is cancelled or the kernel process ends."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), _CHECK_SECONDS)
            if self._stop.is_set():
                return RunOutcome("succeeded", 0, f"kernel ended ({self._stop_reason})")
            if not await self._kernel.alive():
                asked = self._shutdown_asked or (
                    self._end is not None and self._end.shutdown_requested
                )
                if asked:
                    return RunOutcome("succeeded", 0, "the kernel was shut down")
                code = self._kernel.exit_code
                why = "the kernel died" + (f" (exit code {code})" if code is not None else "")
                self._say(why)
                return RunOutcome("failed", code, why, retry=False)

    async def _relay_once(self) -> bool:
        """One WebSocket's life; False when it could not be opened."""
        try:
            ws = await self._open_relay(self._job_id)
        except (ChannelRefused, ChannelUnavailable) as e:
            log.warning("kernel job %s: cannot open its relay: %s", self._job_id, e)
            return False
        if self._end is not None:
            self._shutdown_asked |= self._end.shutdown_requested
            await self._end.close()

        def on_state(state: str) -> None:
            self._later(_send_quietly(ws, state))

        end = KernelEnd(self._kernel.connection_info(), ws.send, on_state=on_state)
        self._end = end
        await end.start()
        try:
            async for frame in ws:
                if isinstance(frame, bytes):
                    await end.feed(frame)
        except ConnectionClosed:
            pass
        finally:
            await ws.close()
        log.info("kernel job %s: relay closed (%s %s)", self._job_id, ws.close_code,
                 ws.close_reason or "")  # fmt: skip
        return True


async def _send_quietly(ws: ClientConnection, text: str) -> None:
    with contextlib.suppress(ConnectionClosed):
        await ws.send(text)
