"""How the worker starts every process that runs user code.

Commands, warm function runners, kernels and gang launchers all start through
:func:`child_options`, the one place that decides what such a process is: its
own session (so a stop takes its whole process group), and whatever the worker
adds around user code (which user it runs as, what happens when the agent dies).

Which user: a worker that runs as root runs user code as its task user
(:mod:`gpulayer.worker.task_user`), set once at start with :func:`use_task_user`;
otherwise as the worker's own user. :func:`task_uid` is who owns a task's files.
"""

import os
from typing import Any

from gpulayer.worker.task_user import TaskUser

__all__ = ["child_options", "task_uid", "task_user", "use_task_user"]

_task_user: TaskUser | None = None


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
    group that a cancel, a timeout or a shutdown stops as a whole. With a task user
    it runs as that user, with that user's groups (the worker's own are dropped).
    """
    options: dict[str, Any] = {"start_new_session": True}
    if _task_user is not None:
        options.update(
            user=_task_user.uid, group=_task_user.gid, extra_groups=list(_task_user.groups)
        )
    return options
