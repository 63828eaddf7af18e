"""Compatibility shim: the handlers moved to the ``jupyter_ext.api`` package.

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .api import health, jobs, sessions, workers
from .api.base import AUTH_RESOURCE, STARTUP_WAIT_SECONDS, GpulayerAPIHandler
from .api.errors import STATUS, validation_error
from .api.health import HealthHandler
from .api.jobs import (
    BlobsHandler,
    JobArtifactHandler,
    JobArtifactsHandler,
    JobBatchHandler,
    JobCancelHandler,
    JobEventsHandler,
    JobHandler,
    JobInterruptHandler,
    JobLogsHandler,
    JobPlacementHandler,
    JobResultHandler,
    JobsHandler,
    JobsWaitHandler,
    JobWaitHandler,
)
from .api.sessions import SessionHandler, SessionsHandler
from .api.workers import WorkerDrainHandler, WorkersHandler, WorkerTelemetryHandler

__all__ = [
    "AUTH_RESOURCE",
    "ROUTES",
    "STARTUP_WAIT_SECONDS",
    "STATUS",
    "BlobsHandler",
    "GpulayerAPIHandler",
    "HealthHandler",
    "JobArtifactHandler",
    "JobArtifactsHandler",
    "JobBatchHandler",
    "JobCancelHandler",
    "JobEventsHandler",
    "JobHandler",
    "JobInterruptHandler",
    "JobLogsHandler",
    "JobPlacementHandler",
    "JobResultHandler",
    "JobWaitHandler",
    "JobsHandler",
    "JobsWaitHandler",
    "SessionHandler",
    "SessionsHandler",
    "WorkerDrainHandler",
    "WorkerTelemetryHandler",
    "WorkersHandler",
    "validation_error",
]

#: The user-facing routes (as the old module listed them).
ROUTES = health.ROUTES + jobs.ROUTES + sessions.ROUTES + workers.ROUTES
