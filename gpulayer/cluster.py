"""Moved to :mod:`gpulayer.cli.cluster`; this path stays importable (tests, benchmarks,
notebooks and the browser tests import ``LocalCluster`` from here)."""

from gpulayer.cli.cluster import (
    DEFAULT_PORT,
    START_DEADLINE_SECONDS,
    STOP_GRACE_SECONDS,
    LocalCluster,
    free_port,
    is_loopback,
    log_tail,
    preferred_port,
)

__all__ = [
    "DEFAULT_PORT",
    "START_DEADLINE_SECONDS",
    "STOP_GRACE_SECONDS",
    "LocalCluster",
    "free_port",
    "is_loopback",
    "log_tail",
    "preferred_port",
]
