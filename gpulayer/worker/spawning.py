"""How the worker starts every process that runs user code.

Commands, warm function runners, kernels and gang launchers all start through
:func:`child_options`, the one place that decides what such a process is: its
own session (so a stop takes its whole process group), and whatever the worker
adds around user code (which user it runs as, what happens when the agent dies).
"""

from typing import Any

__all__ = ["child_options"]


def child_options() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` / ``asyncio.create_subprocess_exec``
    when starting a process that runs user code.

    The child gets a new session, so it and everything it forks share one process
    group that a cancel, a timeout or a shutdown stops as a whole.
    """
    return {"start_new_session": True}
