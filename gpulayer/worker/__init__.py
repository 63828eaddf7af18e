"""The headless worker agent behind ``gpulayer join URL --token T``."""

from gpulayer.worker.agent import AgentConfig, main, run_agent

__all__ = ["AgentConfig", "main", "run_agent"]
