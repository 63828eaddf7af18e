"""What a task runs in: its folder and its environment.

A task gets a directory ``<data_dir>/tasks/<task_id>/`` (:class:`TaskDir`) with
``work/`` (its cwd, where the job's bundle is unpacked) and ``artifacts/`` (files
to keep). Its environment is the worker's, without any credential (:func:`inherited_env`),
then the job's ``env``, then the variables gpulayer guarantees (:func:`task_env`).
"""

import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulayer import bundle
from gpulayer.contracts import Assignment
from gpulayer.worker.spawning import FENCE_ENV

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


class TaskDir:
    """``<tasks_root>/<task_id>/`` with ``work/`` (the cwd) and ``artifacts/``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.artifacts = root / "artifacts"

    @classmethod
    def create(cls, tasks_root: Path, task_id: str) -> "TaskDir":
        """Make a fresh, empty task directory (blocking: call it in a thread)."""
        task_dir = cls(Path(tasks_root).absolute() / task_id)
        if task_dir.root.exists():
            shutil.rmtree(task_dir.root)
        task_dir.work.mkdir(parents=True)
        task_dir.artifacts.mkdir()
        return task_dir

    def unpack(self, data: bytes) -> None:
        """Unpack a source bundle into ``work/`` (blocking).

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
        (the usual function call) costs three ``rmdir``."""
        try:
            for d in (self.work, self.artifacts, self.root):
                d.rmdir()
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)


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
    credentials, then the job's ``env``, then the variables gpulayer guarantees, which a
    job cannot override."""
    env = inherited_env(base)
    env.update(assignment.spec.env)
    keep_fence_mark(env, os.environ if base is None else base)
    env.update(task_vars(assignment, artifacts, control_plane), PYTHONUNBUFFERED="1")
    # The reservation, for every vendor's runtime (a job cannot widen it).
    visible = ",".join(str(i) for i in assignment.gpu_indices)
    for var in _VISIBLE_DEVICES_ENV:
        env[var] = visible
    return env
