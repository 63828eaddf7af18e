"""The embedded store: SQL and typed records live here and nowhere else.

:class:`Store` is one aiosqlite connection (``db.py``) with the queries of each
concern mixed in: jobs and tasks (``jobs.py``), task outputs (log lines and
metric points, ``outputs.py``), workers (``workers.py``), tokens
(``tokens.py``), secrets (sealed values, ``secrets.py``), deleting finished
jobs (``retention.py``) and provider instances with their intents
(``instances.py``). Reads answer
frozen records (``records.py``); the statements that change jobs and tasks are
built in ``writes.py`` for :mod:`jupyter_ext.transitions` and run by
:meth:`Store.apply` in one transaction. The schema and its migrations are in
``schema.py``.
"""

from .instances import InstanceQueries
from .jobs import JobQueries
from .outputs import OutputQueries
from .parts import PartQueries
from .records import (
    ACTIVE_STATES,
    ArtifactRecord,
    EventRecord,
    Hold,
    IdempotencyRecord,
    InstanceRecord,
    IntentRecord,
    JobRecord,
    MetricRecord,
    ResultRecord,
    RunSpan,
    TaskRecord,
    TokenRecord,
    WorkerRecord,
    as_datetime,
    as_optional_datetime,
)
from .retention import RetentionQueries
from .schema import SCHEMA_VERSION
from .secrets import SecretQueries, SecretRecord
from .tokens import TokenQueries
from .workers import WorkerQueries
from .writes import Statement

__all__ = [
    "ACTIVE_STATES",
    "SCHEMA_VERSION",
    "ArtifactRecord",
    "EventRecord",
    "Hold",
    "IdempotencyRecord",
    "InstanceRecord",
    "IntentRecord",
    "JobRecord",
    "MetricRecord",
    "ResultRecord",
    "RunSpan",
    "SecretRecord",
    "Statement",
    "Store",
    "TaskRecord",
    "TokenRecord",
    "WorkerRecord",
    "as_datetime",
    "as_optional_datetime",
]


class Store(
    JobQueries,
    OutputQueries,
    WorkerQueries,
    TokenQueries,
    RetentionQueries,
    SecretQueries,
    InstanceQueries,
    PartQueries,
):
    """Async access to the gpulayer database.

    Methods are small and named for what the services need; each write commits
    before it returns, and batched writes (log lines) use one transaction.
    """
