"""Compatibility shim: moved to ``jupyter_ext.api.worker_facing``.

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .api.worker_facing import (
    ROUTES,
    AcquireHandler,
    BlobHandler,
    HeartbeatHandler,
    RegisterHandler,
    TaskArtifactHandler,
    TaskCompleteHandler,
    TaskLogsHandler,
    TaskResultHandler,
)

__all__ = [
    "ROUTES",
    "AcquireHandler",
    "BlobHandler",
    "HeartbeatHandler",
    "RegisterHandler",
    "TaskArtifactHandler",
    "TaskCompleteHandler",
    "TaskLogsHandler",
    "TaskResultHandler",
]
