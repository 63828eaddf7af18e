"""The headless worker agent behind ``gpulayer join URL``.

The agent loads on first use, so the small modules a task's own processes run
(``python -m gpulayer.worker.rank_call``, the function runner) start without it.
"""

from typing import Any

__all__ = ["AgentConfig", "main", "run_agent"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpulayer.worker import agent

        return getattr(agent, name)
    raise AttributeError(f"module 'gpulayer.worker' has no attribute {name!r}")
