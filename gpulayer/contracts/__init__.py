"""Wire contracts: every message that crosses a process boundary.

The control plane (``jupyter_ext``), the kernel-side client and the worker agent
import only this package to agree on shapes; every name is re-exported here, so
``from gpulayer.contracts import JobSpec`` is the one way in. Each model carries
``api_version`` when it is a top-level document; request models forbid unknown
fields so a typo in a client is a 400 naming the field, not a silently ignored
option.

The modules are split by noun: :mod:`~gpulayer.contracts.jobs` (and
:mod:`~gpulayer.contracts.resources`), :mod:`~gpulayer.contracts.logs`,
:mod:`~gpulayer.contracts.training` (training metrics),
:mod:`~gpulayer.contracts.artifacts`, :mod:`~gpulayer.contracts.workers`,
:mod:`~gpulayer.contracts.tasks` (the worker's task hand-off),
:mod:`~gpulayer.contracts.placement`, :mod:`~gpulayer.contracts.sessions`,
:mod:`~gpulayer.contracts.storage` (garbage collection),
:mod:`~gpulayer.contracts.tokens` and :mod:`~gpulayer.contracts.server` (health,
errors); :mod:`~gpulayer.contracts.base` holds what they share;
:mod:`~gpulayer.contracts.channel` the frames of the live channel (WebSocket).

The routes (all under :data:`API_PREFIX`) and which model each takes and answers
are listed once, in ``docs/api.md``; ``tests/server/test_route_table.py`` fails
when that table and the routes the control plane mounts differ.
"""

from pydantic import BaseModel  # the base of every model here, for annotations

from .artifacts import Artifact, ArtifactList, ArtifactName, BlobRef
from .base import (
    API_PREFIX,
    API_VERSION,
    INLINE_BYTES,
    Accelerator,
    Identifier,
    LabelKey,
    Name,
    Sha256,
    format_duration,
    parse_duration,
    plain_text,
)
from .channel import (
    CHANNEL_ENV,
    CHANNEL_MODES,
    CLIENT_CALLS,
    CLIENT_CHANNEL_PATH,
    CLOSE_GOING_AWAY,
    CLOSE_RESYNC,
    CLOSE_UNAUTHORIZED,
    WORKER_CALLS,
    WORKER_CHANNEL_PATH,
    ChannelAnswer,
    ChannelCall,
    ChannelPush,
)
from .jobs import (
    TERMINAL_STATES,
    CellSpec,
    Event,
    EventList,
    FunctionCall,
    Job,
    JobBatch,
    JobKind,
    JobList,
    JobSpec,
    JobState,
    Launcher,
    SessionSpec,
    Task,
    WaitAny,
)
from .logs import FRAGMENT, KernelMessage, LogAck, LogBatch, LogEntry, LogLine, LogPage, LogStream
from .placement import Placement, WorkerFit
from .resources import (
    PROFILES,
    STORED,
    Resources,
    compute_capability_tuple,
    gpu_model_matcher,
)
from .server import ErrorBody, Health
from .sessions import CreateSession, Session, SessionList
from .storage import GcReport, GcRequest
from .tasks import Acquired, Assignment, Gang, TaskCompletion
from .tokens import CreatedToken, CreateToken, Role, Token, TokenList, TokenState
from .training import (
    MetricAck,
    MetricBatch,
    MetricKey,
    MetricPage,
    MetricPoint,
    StoredMetricPoint,
)
from .workers import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    Device,
    GpuSample,
    Heartbeat,
    HeartbeatReply,
    Registered,
    TaskSample,
    Telemetry,
    TelemetrySample,
    Worker,
    WorkerList,
    WorkerRegistration,
    WorkerState,
)

__all__ = [
    "API_PREFIX",
    "API_VERSION",
    "CHANNEL_ENV",
    "CHANNEL_MODES",
    "CLIENT_CALLS",
    "CLIENT_CHANNEL_PATH",
    "CLOSE_GOING_AWAY",
    "CLOSE_RESYNC",
    "CLOSE_UNAUTHORIZED",
    "DEFAULT_HEARTBEAT_SECONDS",
    "DEFAULT_LEASE_SECONDS",
    "FRAGMENT",
    "INLINE_BYTES",
    "PROFILES",
    "STORED",
    "TERMINAL_STATES",
    "WORKER_CALLS",
    "WORKER_CHANNEL_PATH",
    "Accelerator",
    "Acquired",
    "Artifact",
    "ArtifactList",
    "ArtifactName",
    "Assignment",
    "BaseModel",
    "BlobRef",
    "CellSpec",
    "ChannelAnswer",
    "ChannelCall",
    "ChannelPush",
    "CreateSession",
    "CreateToken",
    "CreatedToken",
    "Device",
    "ErrorBody",
    "Event",
    "EventList",
    "FunctionCall",
    "Gang",
    "GcReport",
    "GcRequest",
    "GpuSample",
    "Health",
    "Heartbeat",
    "HeartbeatReply",
    "Identifier",
    "Job",
    "JobBatch",
    "JobKind",
    "JobList",
    "JobSpec",
    "JobState",
    "KernelMessage",
    "LabelKey",
    "Launcher",
    "LogAck",
    "LogBatch",
    "LogEntry",
    "LogLine",
    "LogPage",
    "LogStream",
    "MetricAck",
    "MetricBatch",
    "MetricKey",
    "MetricPage",
    "MetricPoint",
    "Name",
    "Placement",
    "Registered",
    "Resources",
    "Role",
    "Session",
    "SessionList",
    "SessionSpec",
    "Sha256",
    "StoredMetricPoint",
    "Task",
    "TaskCompletion",
    "TaskSample",
    "Telemetry",
    "TelemetrySample",
    "Token",
    "TokenList",
    "TokenState",
    "WaitAny",
    "Worker",
    "WorkerFit",
    "WorkerList",
    "WorkerRegistration",
    "WorkerState",
    "compute_capability_tuple",
    "format_duration",
    "gpu_model_matcher",
    "parse_duration",
    "plain_text",
]
