"""The unprivileged user a worker that runs as root runs its tasks as.

A task must not read what the worker can: the worker's token and data dir, and
on a ``gpulayer up`` machine the control plane's database and ``admin.token``.
When the worker runs as root, every process that runs user code (commands,
function runners, kernels, gang launchers) starts as :data:`DEFAULT_NAME`
(``gpulayer-task``), or the user ``--task-user NAME`` names, through
:func:`gpulayer.worker.spawning.child_options`. One such user serves every
worker of the machine (docs/adr/0073-tasks-run-as-an-unprivileged-user.md).

A worker that is not root cannot switch users: its tasks run as itself, and
``gpulayer up`` says so when it starts (docs/security.md).

:func:`resolve` is what ``gpulayer join`` calls at start: it creates the user
when missing (``useradd --system``) and makes sure it can run this worker's
Python and import gpulayer, or fails with one line that says what to do.
"""

import grp
import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gpulayer
from gpulayer.errors import ConfigError

#: The task user of a worker that runs as root, unless ``--task-user`` names another.
DEFAULT_NAME = "gpulayer-task"
_PROBE_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class TaskUser:
    """Who a task's processes run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, from /etc/group

    @classmethod
    def named(cls, name: str) -> "TaskUser":
        """The existing user ``name``.

        Raises
        ------
        KeyError
            If there is no such user.
        """
        pw = pwd.getpwnam(name)
        groups = tuple(sorted({g.gr_gid for g in grp.getgrall() if name in g.gr_mem}))
        return cls(name=name, uid=pw.pw_uid, gid=pw.pw_gid, groups=groups)


def resolve(name: str | None, *, check: bool = True) -> TaskUser | None:
    """The user this worker's tasks run as; None means the worker's own user.

    ``name`` is ``--task-user``: None for the default (:data:`DEFAULT_NAME` when the
    worker is root, else the worker's user), ``""`` for the worker's own user. With
    ``check`` False the caller makes sure the user can run this Python (the worker:
    its prestarted runner is the proof, else :func:`check_reachable`).

    Raises
    ------
    ConfigError
        If a task user is asked for without root, cannot be created, or cannot run
        this worker's Python and gpulayer.
    """
    if name == "":
        return None
    if os.geteuid() != 0:
        if name is None or name == pwd.getpwuid(os.geteuid()).pw_name:
            return None
        raise ConfigError(
            f"--task-user {name} needs a worker that runs as root; without root, tasks"
            " run as the worker's own user (leave --task-user out)"
        )
    user = ensure(name or DEFAULT_NAME)
    if user.uid == 0:
        return None  # --task-user root: the worker's own user
    if check:
        check_reachable(user)
    return user


def ensure(name: str) -> TaskUser:
    """The user ``name``, created as a system user without a login when missing.

    Raises
    ------
    ConfigError
        If it is missing and ``useradd`` fails.
    """
    try:
        return TaskUser.named(name)
    except KeyError:
        pass
    argv = ["useradd", "--system", "--user-group", "--no-create-home",
            "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
            "--comment", "gpulayer tasks", name]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"cannot create the task user {name} (useradd): {e}") from e
    try:  # a worker starting beside this one may have made it first
        return TaskUser.named(name)
    except KeyError:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(
            f"cannot create the task user {name}: useradd: {why[-1] if why else done.returncode};"
            f" create it yourself or pass --task-user NAME of an existing user"
        ) from None


def check_reachable(user: TaskUser) -> None:
    """Make sure ``user`` can run this worker's Python and import gpulayer.

    Raises
    ------
    ConfigError
        One line naming the folder in the way and what to do.
    """
    probe = [sys.executable, "-c", "import gpulayer.payload, gpulayer.worker.runner"]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG")}
    try:
        done = subprocess.run(
            probe, user=user.uid, group=user.gid, extra_groups=list(user.groups), env=env,
            cwd="/", capture_output=True, text=True, timeout=_PROBE_TIMEOUT_SECONDS, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        ok, detail = False, str(e)
    else:
        ok, detail = done.returncode == 0, (done.stderr.strip().splitlines() or [""])[-1]
    if ok:
        return
    what, where = _blocked(user)
    fix = (
        f"install Python and gpulayer where other users can read them, or run"
        f" `chmod o+x {where}`, or pass --task-user '' to run tasks as this worker's user"
        if where is not None
        else "pass --task-user '' to run tasks as this worker's user"
    )
    shown = f"{what} ({_why(where)})" if where is not None else f"{sys.executable}: {detail}"
    raise ConfigError(
        f"tasks run as the unprivileged user {user.name}, which cannot use {shown}; {fix}"
    )


def _blocked(user: TaskUser) -> tuple[str, Path | None]:
    """The first of the interpreter's and gpulayer's paths ``user`` cannot reach, and
    the folder on its way that stops it (None when the modes do not explain it)."""
    targets = [
        Path(sys.executable),
        Path(os.path.realpath(sys.executable)),
        Path(os.__file__).parent,  # the standard library
        Path(gpulayer.__file__).parent,
    ]
    for target in targets:
        for folder in (*reversed(target.parents), *([target] if target.is_dir() else [])):
            if not _may_enter(folder, user):
                return str(target), folder
    return str(targets[0]), None


def _may_enter(folder: Path, user: TaskUser) -> bool:
    try:
        st = folder.stat()
    except OSError:
        return True  # not ours to judge: the probe's error is the message
    if st.st_uid == user.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == user.gid or st.st_gid in user.groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _why(folder: Path) -> str:
    st = folder.stat()
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"{folder} is {stat.filemode(st.st_mode)}, only {owner} may enter it"
