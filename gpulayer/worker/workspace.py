"""What a task runs in: its folder and its environment.

A task gets a directory ``<tasks_root>/<task_id>/`` (:class:`TaskDir`) with
``work/`` (its cwd, where the job's bundle is unpacked) and ``artifacts/`` (files
to keep). Its environment is the worker's, without any credential (:func:`inherited_env`),
then the job's ``env``, then the variables gpulayer guarantees (:func:`task_env`).

The tasks root is a folder of its own in the system temp dir
(:func:`make_tasks_root`), never inside the worker's 0700 data dir. With a task
user (:mod:`gpulayer.worker.task_user`) a task's folder belongs to that user once
the worker has prepared it (:meth:`TaskDir.hand_over`), it gets a ``home/`` and a
``tmp/`` of its own (:func:`user_env`), and the worker, which is root, reads what
the task wrote only through :func:`open_owned` and writes into its folder only
through :func:`write_for_task`: a link the task planted never makes the worker
read or overwrite another file.
"""

import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpulayer import bundle
from gpulayer.contracts import Assignment
from gpulayer.worker.spawning import FENCE_ENV, task_uid, task_user

#: Variables of the worker's own environment that carry credentials: a task, a function
#: runner, a kernel or a rank never inherits them (docs/security.md, "What a task can reach").
PRIVATE_ENV = frozenset(
    {
        "GPULAYER_TOKEN",  # a client token of whoever started the worker
        "GPULAYER_JOIN_TOKEN",  # registers workers: a task holding it could join a rogue one
        "GPULAYER_WORKER_TOKEN",
        "JUPYTER_TOKEN",  # a Jupyter server's own token (the control plane's, under `up`)
        "JUPYTERHUB_API_TOKEN",  # a JupyterHub user's API token
        "JPY_API_TOKEN",  # its older name
    }
)
#: A gpulayer token inside any value, whatever the variable is called (``gl_`` + 43).
_TOKEN_IN_VALUE = re.compile(r"(?<![A-Za-z0-9_-])gl_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
_VISIBLE_DEVICES_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
#: Variables that point into the worker user's own folders, which a task user cannot
#: use: its tasks go without them, so their tools fall back to folders under its HOME.
_WORKER_USER_DIRS = (
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MPLCONFIGDIR",
)  # fmt: skip


def make_tasks_root(worker_name: str) -> Path:
    """A fresh folder for this worker's task folders, in the system temp dir (outside
    the worker's data dir): ``gpulayer-tasks-<name>-<random>``, mode 0711, so a task
    user reaches its own task's folder but cannot list the others."""
    root = Path(tempfile.mkdtemp(prefix=f"gpulayer-tasks-{worker_name}-"))
    root.chmod(0o711)
    return root


class TaskDir:
    """``<tasks_root>/<task_id>/`` with ``work/`` (the cwd) and ``artifacts/`` (and,
    with a task user, ``home/`` and ``tmp/``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.artifacts = root / "artifacts"
        self.home = root / "home"
        self.tmp = root / "tmp"

    @classmethod
    def create(cls, tasks_root: Path, task_id: str, *, own_home: bool = True) -> "TaskDir":
        """Make a fresh, empty task directory, the worker's until :meth:`hand_over`
        (blocking: call it in a thread). ``own_home=False`` leaves out ``home/`` and
        ``tmp/`` for a task whose process has its own already (a call in a warm
        runner): each folder made and removed costs ~0.1 ms of CPU on ext4."""
        task_dir = cls(Path(tasks_root).absolute() / task_id)
        if task_dir.root.exists():
            shutil.rmtree(task_dir.root)
        task_dir.root.mkdir(mode=0o700, parents=True)
        task_dir.work.mkdir(mode=0o700)
        task_dir.artifacts.mkdir(mode=0o700)
        if own_home and task_user() is not None:
            task_dir.home.mkdir(mode=0o700)
            task_dir.tmp.mkdir(mode=0o700)
        return task_dir

    def left_empty(self) -> bool:
        """Whether the folder holds nothing but an empty ``work/`` and ``artifacts/``
        (blocking; no link followed): what a call that wrote no file leaves."""
        try:
            with os.scandir(self.root) as it:
                entries = {e.name: e.is_dir(follow_symlinks=False) for e in it}
            if entries != {"work": True, "artifacts": True}:
                return False
            for d in (self.work, self.artifacts):
                with os.scandir(d) as it:
                    if next(it, None) is not None:
                        return False
        except OSError:
            return False
        return True

    def reuse_as(self, tasks_root: Path, task_id: str) -> "TaskDir":
        """This folder, :meth:`left_empty` by an earlier call of the same owner,
        renamed for task ``task_id``, its modes private again (blocking): one rename
        and three chmod where a new folder costs three mkdir, a walk and three chown,
        and removing the old one three rmdir (ADR 0145)."""
        new = TaskDir(Path(tasks_root).absolute() / task_id)
        os.rename(self.root, new.root)
        for d in (new.root, new.work, new.artifacts):
            # Through a descriptor of the folder itself: a process of the earlier call
            # may have put a link in its place since, and a chmod by path would follow
            # it (as root, onto any file). A link fails here (ELOOP): a new folder.
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        return new

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` for a process of this task: with a task user, its own ``home/`` and
        ``tmp/`` (see :func:`user_env`)."""
        return user_env(env, self.home, self.tmp)

    def hand_over(self) -> None:
        """Give the folder, and the bundle unpacked into it, to the task user (blocking;
        nothing to do without one). Call it once the worker has written what it puts
        there: from now on the task may plant links in it."""
        user = task_user()
        if user is None:
            return
        for dirpath, dirnames, filenames in os.walk(self.root):
            os.chown(dirpath, user.uid, user.gid, follow_symlinks=False)
            for name in (*dirnames, *filenames):
                os.chown(os.path.join(dirpath, name), user.uid, user.gid, follow_symlinks=False)

    def unpack(self, data: bytes | Path) -> None:
        """Unpack a source bundle (bytes, or a file read a block at a time) into
        ``work/`` (blocking).

        Raises
        ------
        gpulayer.errors.ValidationError
            If the bundle is not a safe tar.gz.
        """
        bundle.unpack(data, self.work)

    def artifact_files(self) -> list[tuple[str, Path]]:
        """``(name, path)`` of every regular file under ``artifacts/``, names relative
        posix paths, symlinks skipped (blocking)."""
        files = []
        for dirpath, dirnames, filenames in os.walk(self.artifacts):
            dirnames.sort()
            for fname in sorted(filenames):
                path = Path(dirpath, fname)
                if stat.S_ISREG(path.lstat().st_mode):
                    files.append((path.relative_to(self.artifacts).as_posix(), path))
        return files

    def remove(self) -> None:
        """Delete the task directory and everything in it (blocking); an empty one
        (the usual function call) costs three ``rmdir``, with or without a task user."""
        try:
            for d in (self.work, self.artifacts, self.home, self.tmp, self.root):
                try:
                    d.rmdir()
                except FileNotFoundError:  # home/ and tmp/ exist only with a task user
                    if d in (self.root, self.work):
                        raise
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)


def user_env(env: dict[str, str], home: Path, tmp: Path) -> dict[str, str]:
    """``env`` for a process that runs as the task user: ``HOME``, ``TMPDIR``,
    ``USER`` and ``LOGNAME`` its own, without variables that point into the worker
    user's folders. Unchanged without a task user."""
    user = task_user()
    if user is None:
        return env
    for var in _WORKER_USER_DIRS:
        env.pop(var, None)
    env.update(HOME=str(home), TMPDIR=str(tmp), USER=user.name, LOGNAME=user.name)
    return env


def open_owned(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a file a task wrote, for the worker to read (blocking).

    Only a regular file of the task's user: not a link (a task could point one at a
    file only the worker may read), not a FIFO or device (which would block or
    never end), not a file of another user (reached through a linked folder).

    Raises
    ------
    OSError
        If it is missing or is not such a file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != task_uid():
            raise PermissionError(errno.EACCES, "not a regular file of the task's user", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_owned(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a file a task wrote (see :func:`open_owned`; blocking)."""
    with open_owned(path) as f:
        return f.read()


def write_for_task(path: str | os.PathLike[str], data: bytes) -> None:
    """Create a new file for the task to read (blocking): never through a link the
    task planted (``O_EXCL | O_NOFOLLOW``), owned by the task user.

    Raises
    ------
    OSError
        If something is already there.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        user = task_user()
        if user is not None:
            os.fchown(f.fileno(), user.uid, user.gid)
        f.write(data)


def inherited_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a task's environment starts from: ``base`` (default ``os.environ``)
    without the credentials it holds: the :data:`PRIVATE_ENV` variables, and any
    variable whose value holds a gpulayer token."""
    source = os.environ if base is None else base
    return {
        k: v for k, v in source.items() if k not in PRIVATE_ENV and not _TOKEN_IN_VALUE.search(v)
    }


def keep_fence_mark(env: dict[str, str], source: Mapping[str, str]) -> None:
    """Put the worker's fence mark (``GPULAYER_FENCE``, gpulayer/worker/spawning.py)
    back into ``env`` after a job's own variables: a job cannot shed it."""
    if FENCE_ENV in source:
        env[FENCE_ENV] = source[FENCE_ENV]
    else:
        env.pop(FENCE_ENV, None)


@dataclass(frozen=True)
class ControlPlaneAddress:
    """Where a task with ``api_access`` reaches the control plane: the worker's own URL,
    certificate pin and clear-text opt-in."""

    url: str
    fingerprint: str | None = None
    insecure: bool = False

    def env(self, token: str) -> dict[str, str]:
        """What ``gl.connect()`` reads, for ``token``."""
        env = {"GPULAYER_URL": self.url, "GPULAYER_TOKEN": token}
        if self.fingerprint:
            env["GPULAYER_FINGERPRINT"] = self.fingerprint
        if self.insecure:
            env["GPULAYER_INSECURE"] = "1"
        return env


def task_vars(
    assignment: Assignment, artifacts: Path, control_plane: ControlPlaneAddress | None = None
) -> dict[str, str]:
    """The variables gpulayer guarantees each task (a job cannot override them); with
    the task's own token (``api_access``), where and how to call the control plane."""
    out = {
        "GPULAYER_JOB_ID": assignment.job_id,
        "GPULAYER_TASK_ID": assignment.task_id,
        "GPULAYER_ATTEMPT": str(assignment.attempt),
        "GPULAYER_ARTIFACTS": str(Path(artifacts).absolute()),
    }
    if assignment.api_token and control_plane is not None:
        out.update(control_plane.env(assignment.api_token))
    return out


def task_env(
    assignment: Assignment,
    artifacts: Path,
    base: Mapping[str, str] | None = None,
    control_plane: ControlPlaneAddress | None = None,
) -> dict[str, str]:
    """The environment of a task's process: ``base`` (default ``os.environ``) without
    credentials, then the job's ``env`` and secrets, then the variables gpulayer
    guarantees, which a job cannot override."""
    env = inherited_env(base)
    env.update(assignment.spec.env)
    env.update(assignment.secret_env())  # the job's secrets (docs/secrets.md)
    keep_fence_mark(env, os.environ if base is None else base)
    env.update(task_vars(assignment, artifacts, control_plane), PYTHONUNBUFFERED="1")
    # The reservation, for every vendor's runtime (a job cannot widen it).
    visible = ",".join(str(i) for i in assignment.gpu_indices)
    for var in _VISIBLE_DEVICES_ENV:
        env[var] = visible
    return env
