"""Run a command task as a child process, independent of HTTP.

The task's folder and environment come from :mod:`gpulayer.worker.workspace`.
:class:`CommandRun` starts the command in a new session, so the child and
everything it forks share one process group, and hands every output line to a
callback as it arrives. The start itself happens off the event loop
(:func:`gpulayer.worker.spawning.spawn`); the loop learns of the exit from a
pidfd and reads the pipes, with no child-watcher thread per command.

Whatever ends the run, the whole process tree goes with it: a timeout or a cancel
sends SIGTERM to the group (and to descendants that left it) and SIGKILL after a
grace period; children still alive after a normal exit of the command get the
same treatment. Zombies count as gone: they hold no resources and, on a machine
whose init never reaps orphans, would otherwise look alive forever.
"""

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TypeVar

import psutil

from gpulayer.contracts import JobSpec, LogStream, format_duration
from gpulayer.worker.runs import LineCallback, RunOutcome
from gpulayer.worker.spawning import spawn

T = TypeVar("T")

log = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 64 * 1024
_POLL_SECONDS = 0.02


def argv_for(spec: JobSpec) -> list[str]:
    """The argv a job runs: its ``command``, or ``/bin/sh -c`` with its ``shell``."""
    if spec.shell is not None:
        return ["/bin/sh", "-c", spec.shell]
    assert spec.command is not None  # JobSpec guarantees exactly one of the two
    return list(spec.command)


class CommandRun:
    """One run of a command task: start it, stream its lines, stop its whole tree.

    Parameters
    ----------
    spec
        The job; ``command``/``shell`` and ``timeout`` are used here.
    cwd, env
        Working directory and complete environment of the process.
    on_line
        Called with ``(stream, text, ts)`` for each line of stdout and stderr, and
        for ``system`` lines the run writes itself (a command that cannot start).
    kill_grace_seconds
        How long a SIGTERM-ed process group gets before SIGKILL.
    max_line_bytes
        A line longer than this (no newline in sight) is handed over in pieces.
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        cwd: Path,
        env: Mapping[str, str],
        on_line: LineCallback,
        kill_grace_seconds: float = 5.0,
        max_line_bytes: int = 1024 * 1024,
    ) -> None:
        self.argv = argv_for(spec)
        self.timeout_seconds = spec.timeout
        self.cwd = cwd
        self.env = dict(env)
        self.on_line = on_line
        self.kill_grace_seconds = kill_grace_seconds
        self.max_line_bytes = max_line_bytes
        self._cancel_reason: str | None = None
        self._cancelled = asyncio.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._exit: asyncio.Future[int] | None = None
        self._escaped: list[psutil.Process] = []

    @property
    def pid(self) -> int | None:
        """The process id of the command (its process group id too), once started."""
        return None if self._proc is None else self._proc.pid

    def cancel(self, reason: str = "cancelled by user") -> None:
        """Stop the run (SIGTERM, then SIGKILL after the grace); it ends ``cancelled``.

        Safe before :meth:`run` (the command then never starts) and after it ended.
        """
        if self._cancel_reason is None:
            self._cancel_reason = reason
            self._cancelled.set()

    def interrupt(self) -> None:
        """Nothing to do: a command is only ever stopped whole (:meth:`cancel`)."""

    async def run(self) -> RunOutcome:
        """Run the command to its end and say how it ended. Call once."""
        if self._cancel_reason is not None:
            return RunOutcome("cancelled", None, self._cancel_reason)
        try:
            proc = await spawn(self.argv, cwd=self.cwd, env=self.env)
        except OSError as e:
            reason = f"cannot start {self.argv[0]!r}: {e.strerror or e}"
            self.on_line(LogStream.system, reason, datetime.now(UTC))
            return RunOutcome("failed", None, reason)
        self._proc = proc
        self._exit = _watch_exit(proc)
        pumps: list[asyncio.Task[None]] = []
        pipes: list[asyncio.BaseTransport] = []
        finished = False
        try:
            assert proc.stdout is not None and proc.stderr is not None
            for pipe, stream in ((proc.stdout, LogStream.stdout), (proc.stderr, LogStream.stderr)):
                reader, transport = await _read_end(pipe)
                pipes.append(transport)
                pumps.append(asyncio.create_task(self._pump(reader, stream)))
            cause = await self._wait(proc)
            # After a normal exit only lingering children are left to stop.
            await self._stop_tree(proc)
            await self._drain(pumps)
            finished = True
        finally:
            for pump in pumps:
                pump.cancel()
            for transport in pipes:
                transport.close()
            if not finished:  # run() itself was cancelled or failed: leave nothing behind
                self._signal_tree(proc.pid, signal.SIGKILL)
        return self._outcome(cause, proc.returncode)

    async def _wait(self, proc: "subprocess.Popen[bytes]") -> str | None:
        """Wait for the exit, a cancel or the timeout; ``None`` for an exit by itself."""
        assert self._exit is not None
        exited: asyncio.Future[object] = asyncio.shield(self._exit)
        cancelled: asyncio.Future[object] = asyncio.ensure_future(self._cancelled.wait())
        try:
            done, _ = await asyncio.wait(
                {exited, cancelled},
                timeout=self.timeout_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            exited.cancel()
            cancelled.cancel()
        if exited in done:
            return None
        return "cancel" if cancelled in done else "timeout"

    def _outcome(self, cause: str | None, returncode: int | None) -> RunOutcome:
        """Map what ended the run and the exit status onto a task state."""
        if cause == "cancel":
            return RunOutcome("cancelled", returncode, self._cancel_reason)
        if cause == "timeout":
            reason = f"timed out after {format_duration(self.timeout_seconds)}"
            return RunOutcome("timed_out", returncode, reason)
        if returncode == 0:
            return RunOutcome("succeeded", 0, None)
        if returncode is not None and returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            return RunOutcome("failed", returncode, f"killed by signal {name}")
        return RunOutcome("failed", returncode, f"exit code {returncode}")

    # -------------------------------------------------------------- the tree

    async def _stop_tree(self, proc: "subprocess.Popen[bytes]") -> None:
        """SIGTERM the process group and strays, SIGKILL whatever outlives the grace."""
        if proc.returncode is None:
            # Descendants that called setsid() left the group; find them while the
            # leader is alive, because once it is gone they are orphans of init.
            with contextlib.suppress(psutil.Error):
                self._escaped = psutil.Process(proc.pid).children(recursive=True)
        elif not self._alive(proc.pid):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.kill_grace_seconds
        self._signal_tree(proc.pid, signal.SIGTERM)
        if await self._gone_by(proc, deadline):
            return
        log.debug("process group %s outlived SIGTERM; sending SIGKILL", proc.pid)
        self._signal_tree(proc.pid, signal.SIGKILL)
        await self._gone_by(proc, loop.time() + 1.0)

    async def _gone_by(self, proc: "subprocess.Popen[bytes]", deadline: float) -> bool:
        """Wait until the leader and the rest of the tree are gone, or the deadline."""
        loop = asyncio.get_running_loop()
        assert self._exit is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exit), max(deadline - loop.time(), 0))
        # Other members are not our children: no event tells when they are gone.
        while self._alive(proc.pid):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_POLL_SECONDS)
        return True

    def _alive(self, pgid: int) -> bool:
        """True while a live (non-zombie) member of the group or a stray exists."""
        return bool(_group_members(pgid)) or any(_is_live(p) for p in self._escaped)

    def _signal_tree(self, pgid: int, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group and to descendants that left it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for p in self._escaped:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)  # psutil checks the pid was not reused

    # ------------------------------------------------------------ the output

    async def _drain(self, pumps: list["asyncio.Task[None]"]) -> None:
        """Let the readers reach end of file; give up if something still holds a pipe."""
        done, pending = await asyncio.wait(pumps, timeout=self.kill_grace_seconds)
        for pump in done:
            pump.result()  # an error of on_line surfaces here
        if pending:
            self.on_line(
                LogStream.system,
                "stopped reading output: a process outside the task still holds its pipes",
                datetime.now(UTC),
            )

    async def _pump(self, reader: asyncio.StreamReader, stream: LogStream) -> None:
        """Split a pipe into lines (any length, last one maybe without newline)."""
        pending = bytearray()
        while chunk := await reader.read(_READ_CHUNK_BYTES):
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                pending += chunk[start:nl]
                self._emit(stream, pending)
                pending.clear()
                start = nl + 1
            pending += chunk[start:]
            while len(pending) > self.max_line_bytes:
                cut = _utf8_boundary(pending, self.max_line_bytes)
                self._emit(stream, pending[:cut])
                del pending[:cut]
        if pending:
            self._emit(stream, pending)

    def _emit(self, stream: LogStream, data: bytearray) -> None:
        self.on_line(stream, data.decode("utf-8", errors="replace"), datetime.now(UTC))


def in_daemon_thread(call: Callable[[], T]) -> "asyncio.Future[T]":
    """What ``call()`` returns (or raises), made in a daemon thread: whoever stops
    waiting for it (a cancelled future, a closed loop) leaves the thread behind,
    and the interpreter exits without joining it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if future.done():  # nobody waits any more
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]  # call() returned it

    def run() -> None:
        value, error = None, None
        try:
            value = call()
        except BaseException as e:  # handed to whoever awaits the future
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name=f"gpulayer-{getattr(call, '__name__', 'call')}",
                     daemon=True).start()  # fmt: skip
    return future


def _watch_exit(proc: "subprocess.Popen[bytes]") -> "asyncio.Future[int]":
    """The command's exit status, once it has exited (its pipes may stay open).

    The process is reaped as it exits, whether or not anyone still waits for it,
    so it never stays a zombie while the agent runs. On Linux a pidfd tells the
    event loop (no thread, no child watcher); elsewhere a thread waits.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+
        return in_daemon_thread(proc.wait)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()

    def settle(code: int) -> None:
        if not exited.done():
            exited.set_result(code)

    def readable() -> None:
        code = proc.poll()  # reaps it
        if code is None:
            return
        loop.remove_reader(fd)
        os.close(fd)
        settle(code)

    loop.add_reader(fd, readable)
    return exited


async def _read_end(pipe: IO[bytes]) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A reader of the child's end of ``pipe`` on the event loop, and its transport
    (closing it closes the pipe)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_CHUNK_BYTES, loop=loop)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
    )
    return reader, transport


def _utf8_boundary(data: bytearray, limit: int) -> int:
    """The largest cut ``<= limit`` that does not split a UTF-8 character."""
    cut = limit
    # Continuation bytes look like 0b10xxxxxx; a character has at most 3 of them.
    while cut > limit - 3 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def _is_live(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # some member belongs to another user; look closer
    members = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                members.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return members
