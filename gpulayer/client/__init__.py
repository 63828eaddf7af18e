"""The sync Python client of the gpulayer control plane (kernel side and CLI); no IPython.

* :mod:`~gpulayer.client.connection`: :class:`Connection`, one method per route
* :mod:`~gpulayer.client.config`: where the URL, token and pin come from
* :mod:`~gpulayer.client.default`: the process's default connection (``gl.connect``)
* :mod:`~gpulayer.client.specs`: the one list of job and resource options
* :mod:`~gpulayer.client.jobs`: ``gl.submit`` and the :class:`Job` handle
* :mod:`~gpulayer.client.logs`: reading a job's stored output
* :mod:`~gpulayer.client.artifacts`: downloading a job's artifacts below a folder
* :mod:`~gpulayer.client.cells`: cells in remote kernels (behind ``%%gpulayer``)
* :mod:`~gpulayer.client.pending`: why a queued job waits, said where people wait
"""

from gpulayer.client.connection import DEFAULT_TIMEOUT, LONG_POLL_SECONDS, Connection
from gpulayer.client.default import connect, current_connection, default_connection
from gpulayer.client.jobs import Job, failure_of, submit
from gpulayer.client.specs import pydantic_to_gpulayer

__all__ = [
    "DEFAULT_TIMEOUT",
    "LONG_POLL_SECONDS",
    "Connection",
    "Job",
    "connect",
    "current_connection",
    "default_connection",
    "failure_of",
    "pydantic_to_gpulayer",
    "submit",
]
