"""How the worker starts every process that runs user code, and how they end with it.

Commands, warm function runners, kernels and gang launchers all start through
:func:`child_options`, the one place that decides what such a process is: its
own session (so a stop takes its whole process group), and whatever the worker
adds around user code (which user it runs as, what happens when the agent dies).

Which user: a worker that runs as root runs user code as its task user
(:mod:`gpulayer.worker.task_user`), set once at start with :func:`use_task_user`;
otherwise as the worker's own user. :func:`task_uid` is who owns a task's files.

A task never outlives its worker (docs/adr/0082-fencing.md). On Linux:

* every such process gets a parent-death signal (``prctl(PR_SET_PDEATHSIG,
  SIGKILL)``), so the kernel kills it the moment the agent dies, ``kill -9``
  included;
* while a :class:`Fence` is up (``gpulayer join`` starts one), each such process
  also writes its pid (its process group) to the fence's pipe before it runs
  anything, and inherits ``GPULAYER_FENCE=<id>``. The supervisor at the other end
  of the pipe (:mod:`gpulayer.worker.supervisor`) kills those process groups and
  every process carrying that mark when the pipe closes (the agent died) or when
  the agent's lease runs out unrenewed (the agent is frozen or cut off), which
  takes the descendants that left the group too (torchrun's ranks, daemons).

Elsewhere only the new session is set up.

Commands start cheaper (:func:`spawn`, docs/adr/0130): a ``preexec_fn`` makes
``subprocess`` fork the whole agent (copying its page tables, then faulting in
what the child touches) where it could ``vfork``, and a change of user does too.
Where ``setpriv`` (util-linux) is installed, a command instead starts as
``setpriv [--reuid --regid --groups] --pdeathsig KILL -- COMMAND`` through a
``vfork``: ``setpriv`` changes the user first and asks for the parent-death signal
after (a change of user would clear it), then executes the command in its place
(same pid, same process group). The agent registers the process group with the
fence itself, right after the start. The start runs on one long-lived thread
(:data:`_SPAWN_THREAD`), never on the event loop: the parent-death signal comes
when the *thread* that started the process ends, and that thread never does
while the agent lives.
"""

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpulayer.worker.task_user import TaskUser

__all__ = [
    "FENCE_ENV",
    "Fence",
    "child_options",
    "die_with_parent",
    "name_process",
    "spawn",
    "task_uid",
    "task_user",
    "use_task_user",
]

log = logging.getLogger(__name__)

#: Every process a fenced agent starts (and all their descendants) carries this
#: variable, set to the fence's id; the supervisor finds them by it.
FENCE_ENV = "GPULAYER_FENCE"

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter links
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):  # no libc we can load: no parent-death signal
        return None
    return prctl


_prctl = _load_prctl()
#: ``setpriv`` (util-linux), the cheap way to start a command (module docstring);
#: None where it is missing or the platform has no parent-death signal.
_SETPRIV = shutil.which("setpriv") if _prctl is not None else None
#: The one thread commands start on. A ThreadPoolExecutor never retires an idle
#: worker, so the thread (which the children's parent-death signal is tied to)
#: lives until the agent exits.
_SPAWN_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulayer-spawn")
#: The write end of the running fence's pipe (None: no fence).
_fence_fd: int | None = None
_task_user: TaskUser | None = None


def remove_when_gone(folder: Path) -> None:
    """Have the running fence's supervisor remove ``folder`` (an absolute path) once
    this process is gone, however it ends; nothing without a fence."""
    _tell_about(b"clean", folder)


def removed(folder: Path) -> None:
    """``folder``, given to :func:`remove_when_gone`, was removed here: the supervisor
    forgets it (a later folder of the same name is not ours)."""
    _tell_about(b"forget", folder)


def _tell_about(verb: bytes, folder: Path) -> None:
    text = str(folder)
    if _fence_fd is None or "\n" in text or not folder.is_absolute():
        return
    with contextlib.suppress(OSError):  # a full pipe or a dead supervisor: left behind
        os.write(_fence_fd, verb + b" " + os.fsencode(text) + b"\n")


def use_task_user(user: TaskUser | None) -> None:
    """Run user code as ``user`` from now on (None: as this process's user)."""
    global _task_user
    _task_user = user


def task_user() -> TaskUser | None:
    """The user that runs user code, or None when it is the worker's own."""
    return _task_user


def task_uid() -> int:
    """The uid that owns a task's processes and files."""
    return os.geteuid() if _task_user is None else _task_user.uid


def child_options() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` / ``asyncio.create_subprocess_exec``
    when starting a process that runs user code.

    The child gets a new session, so it and everything it forks share one process
    group that a cancel, a timeout or a shutdown stops as a whole; on Linux it also
    dies with the agent and registers with the fence (module docstring).

    Whatever else this adds for the child (e.g. the user it runs as) must take
    effect before the ``preexec_fn`` runs: a change of user clears the parent-death
    signal. Popen's ``user=``/``group=`` do (they apply before ``preexec_fn``); a
    second ``preexec_fn`` must call this one last. With a task user the child runs
    as that user, with that user's groups (the worker's own are dropped).
    """
    options: dict[str, Any] = {"start_new_session": True}
    if _task_user is not None:
        options.update(
            user=_task_user.uid, group=_task_user.gid, extra_groups=list(_task_user.groups)
        )
    preexec = die_with_parent(register=_fence_fd)
    if preexec is not None:
        options["preexec_fn"] = preexec
    return options


async def spawn(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], cheap: bool = True
) -> "subprocess.Popen[bytes]":
    """Start a command that runs user code, as :func:`child_options` says, with its
    stdin on ``/dev/null`` and its stdout and stderr on pipes; off the event loop.

    With ``cheap`` (the default) and ``setpriv`` at hand it starts through
    ``setpriv`` and a ``vfork`` (module docstring); otherwise with
    :func:`child_options`' ``preexec_fn`` and a fork.

    Raises
    ------
    OSError
        If the command or ``cwd`` cannot be found or run (as ``subprocess.Popen``).
    """
    loop = asyncio.get_running_loop()
    start = _start_through_setpriv if cheap and _SETPRIV is not None else _start_forked
    return await loop.run_in_executor(_SPAWN_THREAD, start, list(argv), cwd, dict(env))


def _start_forked(argv: list[str], cwd: Path, env: dict[str, str]) -> "subprocess.Popen[bytes]":
    return subprocess.Popen(
        argv, cwd=cwd, env=env, **child_options(),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _start_through_setpriv(
    argv: list[str], cwd: Path, env: dict[str, str]
) -> "subprocess.Popen[bytes]":
    assert _SETPRIV is not None
    # Found here as Popen would find it (the child's PATH, from cwd), so a missing
    # command fails as before, not as setpriv's exit code 127.
    command = _which(argv[0], cwd, env)
    prefix = [_SETPRIV]
    if _task_user is not None:
        u = _task_user
        groups = ",".join(str(g) for g in u.groups)
        prefix += [f"--reuid={u.uid}", f"--regid={u.gid}"]
        prefix += [f"--groups={groups}"] if groups else ["--clear-groups"]
    prefix += ["--pdeathsig", "KILL", "--"]
    proc = subprocess.Popen(
        [*prefix, command, *argv[1:]], cwd=cwd, env=env, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    if _fence_fd is not None:
        with contextlib.suppress(OSError):  # as in the child: the mark still finds it
            os.write(_fence_fd, b"pid %d\n" % proc.pid)
    return proc


def _which(name: str, cwd: Path, env: Mapping[str, str]) -> str:
    """``name`` as ``execvpe`` in ``cwd`` with ``env`` would find it."""
    cwd = Path(cwd)  # a str too, as Popen takes
    if os.sep in name:
        path = cwd / name
        if not path.exists():
            raise FileNotFoundError(2, os.strerror(2), name)
        return str(path)
    for folder in os.get_exec_path(dict(env)):
        path = cwd / folder / name
        if os.access(path, os.X_OK) and not path.is_dir():
            return str(path)
    raise FileNotFoundError(2, os.strerror(2), name)


def die_with_parent(
    sig: signal.Signals = signal.SIGKILL, register: int | None = None
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when this process dies (None
    where the platform has no parent-death signal); with ``register``, the child
    also writes its pid there (a fence's pipe) before it runs anything.

    Start the child from a thread that lives as long as this process (the event
    loop's, or the main thread): the signal comes when the *thread* that forked
    it ends.
    """
    if _prctl is None:
        return None
    return functools.partial(_in_child, _prctl, os.getpid(), int(sig), register)


def name_process(name: str) -> None:
    """Name this process as ``ps -o comm`` and ``top`` show it (the kernel keeps 15
    bytes); nothing where the platform has no ``prctl``."""
    if _prctl is not None:
        _prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _in_child(
    prctl: Callable[..., int], parent: int, sig: int, register: int | None
) -> None:  # pragma: no cover - runs between fork and exec, where coverage cannot see
    """Between fork and exec: ask for ``sig`` when the parent dies, then register."""
    prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    if register is not None:
        # One short write is atomic on a pipe; a full or closed pipe only costs the
        # registration (the supervisor still finds the process by its mark).
        with contextlib.suppress(OSError):
            os.write(register, b"pid %d\n" % os.getpid())


class Fence:
    """The agent's side of its supervisor (:mod:`gpulayer.worker.supervisor`).

    :meth:`start` creates the pipe, starts the supervisor on its read end and
    marks this process's environment, so every process started afterwards (with
    :func:`child_options` or not) carries the fence's mark. The supervisor kills
    them all when this process dies, when :meth:`close` is called, or when the
    deadline given to :meth:`hold_until` passes without a newer one.
    """

    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls) -> "Fence | None":
        """Start a fence (None where the platform has none: not Linux)."""
        global _fence_fd
        if _prctl is None or not os.path.isdir("/proc"):
            return None
        fence = cls()
        fence._read_fd, fence._write_fd = os.pipe()  # neither is inherited across exec
        os.set_blocking(fence._write_fd, False)  # a stuck supervisor never blocks a start
        fence._spawn()
        os.environ[FENCE_ENV] = fence.id
        _fence_fd = fence._write_fd
        return fence

    @property
    def pid(self) -> int | None:
        """The supervisor's process id."""
        return None if self._proc is None else self._proc.pid

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != FENCE_ENV}
        argv = [sys.executable, "-m", "gpulayer.worker.supervisor", self.id, str(os.getpid())]
        # Its own session: whoever stops the agent's process group leaves it standing
        # to clean up after the agent.
        self._proc = subprocess.Popen(
            argv, stdin=self._read_fd, stdout=subprocess.DEVNULL, env=env, start_new_session=True
        )
        log.debug("fence %s: supervisor pid %d", self.id, self._proc.pid)

    def check(self) -> None:
        """Start the supervisor again if it died (what the pipe holds is not lost)."""
        if self._proc is not None and self._proc.poll() is not None:
            log.warning(
                "the task supervisor exited (code %s); starting it again", self._proc.returncode
            )
            self._spawn()

    def hold_until(self, deadline: float) -> None:
        """Let tasks run until ``deadline`` (``time.monotonic()``, which is the same
        clock in every process of the machine) unless a later call moves it."""
        self._send(b"until %.3f\n" % deadline)

    def stop_all(self) -> None:
        """Kill every task process now."""
        self._send(b"stop\n")

    def _send(self, line: bytes) -> None:
        if self._write_fd is None:
            return
        try:
            os.write(self._write_fd, line)
        except OSError as e:  # a full pipe (supervisor stuck) or a dead supervisor
            log.warning("cannot reach the task supervisor: %s", e)

    def close(self, timeout: float = 10.0) -> None:
        """Close the pipe: the supervisor kills what is left of the tasks and exits."""
        global _fence_fd
        if self._write_fd is None:
            return
        if _fence_fd == self._write_fd:
            _fence_fd = None
        os.environ.pop(FENCE_ENV, None)
        os.close(self._write_fd)
        self._write_fd = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the task supervisor did not exit within %ss", timeout)
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
