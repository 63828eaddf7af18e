"""One import for all the workers ``gpulayer up`` starts: the caller's side of the
fork server (ADR 0151; the server is :mod:`gpulayer.forkserver`).

A worker's interpreter spends most of its start importing (pydantic and the wire
models, httpx, websockets, the agent: ~0.2 s of CPU here), and ``gpulayer up
--local-workers N`` used to pay that N times, beside the control plane's own import, on
the same cores. :class:`ForkServer` starts one process (``python -m
gpulayer.forkserver``) that imports what ``gpulayer join`` needs once and then
forks each local worker from it: a worker is then exactly what ``gpulayer join``
would run, started without importing anything again.

:class:`LocalCluster <gpulayer.cli.cluster.LocalCluster>` holds each forked worker
through a :class:`Forked` handle, which answers what it asks of a
``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``send_signal``, ``stdin``,
``returncode``). The fork server is the workers' parent and reaps them: it sends
each exit status back. The handle signals its process through a pidfd (Linux 5.3+),
which never names another process once that one has exited. Where pidfds are
missing (:func:`available` is False), the cluster starts its workers one
interpreter each, as before.

The wire: one ``SOCK_SEQPACKET`` socket pair. A request is ``{"args": [...], "cwd":
...}`` with two file descriptors (the worker's stdin and its log); the answer is
``{"pid": N}`` with a pidfd, or ``{"error": ...}``; an exit is ``{"exited": N,
"code": C}`` (negative: killed by that signal, as ``Popen.returncode``). The fork
server exits once its socket is closed and its last worker has exited; it dies
with the process that started it, and its workers die with it.
"""

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from gpulayer.cli.processes import spawn
from gpulayer.private import open_private

log = logging.getLogger(__name__)

#: The largest message either side reads (gpulayer/forkserver.py has the same).
MAX_MESSAGE = 1 << 16
#: How long a fork may take, the server's imports included (~0.3 s here).
_FORK_SECONDS = 30.0


def available() -> bool:
    """Whether this platform can run a fork server (Linux with pidfds)."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "pidfd_open")
        and hasattr(signal, "pidfd_send_signal")
        and hasattr(socket, "send_fds")
    )


class ForkServer:
    """The caller's side: start the fork server, fork workers from it, stop it.

    Use it from one thread at a time (as :class:`LocalCluster` is used).
    """

    def __init__(
        self, log_file: Path, env: dict[str, str], *, cwd: Path, argv: list[str] | None = None
    ) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        self._children: dict[int, Forked] = {}
        self._gone = False  # it exited (or was killed) before its workers
        self._closed = False
        try:
            cmd = argv or [sys.executable, "-m", "gpulayer.forkserver"]
            self.proc = spawn(
                [*cmd, str(theirs.fileno())], log_file, env, cwd=cwd, pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()

    def fork(self, args: list[str], *, log_file: Path, cwd: Path, stdin_pipe: bool) -> "Forked":
        """Fork ``gpulayer <args>`` (``join ...``) with its output appended to
        ``log_file``; ``stdin_pipe``: its stdin is a pipe the caller writes.

        Raises
        ------
        OSError
            When the fork server is gone or could not fork.
        """
        out = open_private(log_file, os.O_WRONLY | os.O_APPEND)
        r, w = os.pipe() if stdin_pipe else (os.open(os.devnull, os.O_RDONLY), -1)
        try:
            request = json.dumps({"args": args, "cwd": str(cwd)}).encode()
            with self._lock:
                socket.send_fds(self._sock, [request], [r, out])
                answer = self._read_until(lambda m: "pid" in m or "error" in m, _FORK_SECONDS)
        except BaseException:
            if w >= 0:
                os.close(w)
            raise
        finally:
            os.close(r)
            os.close(out)
        if answer is None and not self._gone:  # stuck: nothing may arrive late from it
            with contextlib.suppress(OSError):
                self.proc.kill()
            with self._lock:
                self._server_gone()
        if answer is None or "error" in answer:
            if w >= 0:
                os.close(w)
            why = "no answer" if answer is None else answer["error"]
            raise OSError(f"the fork server could not start a worker: {why}")
        forked = Forked(self, int(answer["pid"]), answer["_fd"], w)
        self._children[forked.pid] = forked
        log.debug("forked %s (pid %s), log %s", args[:2], forked.pid, log_file)
        return forked

    def _read_until(self, want: Any, timeout: float | None) -> dict[str, Any] | None:
        """Read messages (lock held) until one ``want(message)`` accepts, which is
        answered; exits are noted on the way. None at ``timeout`` (seconds; 0: only
        what has arrived) or once the server is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._gone and not self._closed:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._sock.settimeout(left)
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, MAX_MESSAGE, 2)
            except (TimeoutError, BlockingIOError):
                return None
            except OSError:
                data, fds = b"", []
            if not data:
                self._server_gone()
                return None
            message: dict[str, Any] = json.loads(data)
            message["_fd"] = fds[0] if fds else -1
            if "exited" in message:
                child = self._children.pop(int(message["exited"]), None)
                if child is not None:
                    child.returncode = int(message["code"])
                    child.close_pidfd()
            if want(message):
                return message
        return None

    def _server_gone(self) -> None:
        """The fork server exited before its workers did (it was killed): they die
        with it (their parent-death signal), so each is taken as killed."""
        self._gone = True
        for child in self._children.values():
            if child._pidfd >= 0:
                with contextlib.suppress(OSError):
                    _readable(child._pidfd, 5.0)
            child.returncode = -signal.SIGKILL
            child.close_pidfd()
        self._children.clear()

    def _drain(self) -> None:
        """Note the exits the server has sent, without waiting."""
        with self._lock:
            self._read_until(lambda m: False, 0.0)

    def _wait_for(self, child: "Forked", timeout: float | None) -> None:
        with self._lock:
            if child.returncode is None:
                self._read_until(lambda m: child.returncode is not None, timeout)

    def close(self) -> None:
        """Stop taking requests, once every worker forked has exited and been waited
        for; the server then exits (the caller reaps :attr:`proc`)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        self._sock.close()


class Forked:
    """A worker the fork server forked, held like a ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int, pidfd: int, stdin_fd: int) -> None:
        self._server = server
        self.pid = pid
        self._pidfd = pidfd
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = os.fdopen(stdin_fd, "wb") if stdin_fd >= 0 else None
        self.args = ["gpulayer", "join"]

    def __repr__(self) -> str:
        return f"<Forked pid={self.pid} returncode={self.returncode}>"

    def poll(self) -> int | None:
        """The exit code once the process has exited and been reaped, else None."""
        if self.returncode is None:
            self._server._drain()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code.

        Raises
        ------
        subprocess.TimeoutExpired
            When it is still running after ``timeout`` seconds.
        """
        self._server._wait_for(self, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig``; nothing once it has exited (its pid may be another's by then)."""
        if self.poll() is None and self._pidfd >= 0:
            signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    def close_pidfd(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def _readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))
