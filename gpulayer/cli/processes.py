"""The subprocesses a :class:`~gpulayer.cli.cluster.LocalCluster` owns: free ports,
starting one with its log file, signalling and reaping it, the tail of its log."""

import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Protocol

from gpulayer.private import open_private, private_dir
from gpulayer.worker.spawning import die_with_parent

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
STOP_GRACE_SECONDS = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def preferred_port(host: str = "127.0.0.1", preferred: int = DEFAULT_PORT) -> int:
    """``preferred`` when it is free on ``host`` (so URLs stay the same across
    restarts), else any free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, preferred))
        except OSError:
            return free_port(host)
    return preferred


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach."""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Process(Protocol):
    """What a cluster asks of a process it started: a ``subprocess.Popen``, or a
    worker forked by the fork server (:class:`gpulayer.cli.forks.Forked`)."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


def spawn(
    argv: list[str],
    log_file: Path,
    extra_env: Mapping[str, str],
    *,
    cwd: Path,
    stdin_pipe: bool = False,
    pass_fds: tuple[int, ...] = (),
) -> "subprocess.Popen[bytes]":
    """Start ``argv`` in its own session, output appended to ``log_file``; on Linux it
    gets SIGKILL when this process dies (``kill -9`` included), so a control plane
    or worker never outlives the ``gpulayer up`` (or test) that started it. Call it
    from a thread that lives as long as the process (the main thread).
    ``stdin_pipe``: its standard input is a pipe the caller writes (else nothing);
    ``pass_fds``: descriptors it inherits (as ``subprocess.Popen``'s)."""
    env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1"}
    private_dir(log_file.parent)
    with os.fdopen(open_private(log_file, os.O_WRONLY | os.O_APPEND), "ab") as out:
        # A new session: a Ctrl-C in the terminal reaches only the parent,
        # which stops the children in order (workers before the server). A worker
        # killed with its parent takes its tasks along (gpulayer/worker/spawning.py).
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent(),
            pass_fds=pass_fds,
        )
    log.debug("started %s (pid %s), log %s", argv[2:4], proc.pid, log_file)
    return proc


def exited(what: str, code: object, log_file: Path) -> str:
    """Why a process that should run is gone: its exit code and its log's tail."""
    tail = log_tail(log_file)
    if not tail:
        return f"{what} exited (code {code}) without output; see {log_file}"
    return f"{what} exited (code {code}); {log_file} ends:\n{tail}"


def signal_if_running(proc: Process, sig: int) -> None:
    """Send ``sig`` to ``proc`` unless it has exited."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # exited in between
            proc.send_signal(sig)


def reap(proc: Process) -> None:
    """Wait for ``proc``; SIGKILL its process group when it does not exit in time.
    Its stdin pipe, if it still has one (a worker stopped before its join token
    came), is closed."""
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(OSError):  # it exited: the pipe is broken
            proc.stdin.close()
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        log.warning("pid %s did not stop within %ss; killing it", proc.pid, STOP_GRACE_SECONDS)
        # Its own session (start_new_session): the group holds only what it started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
