"""Wire contracts: every message that crosses a process boundary.

The control plane (``jupyter_ext``), the kernel-side client and the worker agent
import only this package to agree on shapes; every name is re-exported here, so
``from gpulayer.contracts import JobSpec`` is the one way in. Each model carries
``api_version`` when it is a top-level document; request models forbid unknown
fields so a typo in a client is a 400 naming the field, not a silently ignored
option.

The modules are split by noun: :mod:`~gpulayer.contracts.jobs` (and
:mod:`~gpulayer.contracts.resources`, :mod:`~gpulayer.contracts.environments`),
:mod:`~gpulayer.contracts.logs`,
:mod:`~gpulayer.contracts.training` (training metrics),
:mod:`~gpulayer.contracts.artifacts`, :mod:`~gpulayer.contracts.workers`,
:mod:`~gpulayer.contracts.tasks` (the worker's task hand-off),
:mod:`~gpulayer.contracts.placement`, :mod:`~gpulayer.contracts.sessions`,
:mod:`~gpulayer.contracts.storage` (garbage collection),
:mod:`~gpulayer.contracts.tokens`, :mod:`~gpulayer.contracts.secrets`,
:mod:`~gpulayer.contracts.providers` (providers, offers, instances and their
configuration) and :mod:`~gpulayer.contracts.server` (health, errors);
:mod:`~gpulayer.contracts.base` holds what they share.

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
from .environments import (
    CachedEnv,
    EnvPhase,
    EnvSpec,
    TaskEnvironment,
    Wheel,
    requirement,
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
from .providers import (
    ENDED_INSTANCE_STATES,
    Instance,
    InstanceList,
    InstanceState,
    Offer,
    Provider,
    ProviderConfig,
    ProviderConfigError,
    ProviderList,
    Provisioning,
    parse_providers,
)
from .resources import (
    PROFILES,
    STORED,
    Resources,
    compute_capability_tuple,
    gpu_model_matcher,
)
from .secrets import (
    MAX_SECRET_CHARS,
    MIN_SECRET_CHARS,
    Secret,
    SecretList,
    SecretName,
    SetSecret,
)
from .server import ErrorBody, Health
from .sessions import CreateSession, Session, SessionList
from .storage import GcReport, GcRequest
from .tasks import (
    Acquired,
    Assignment,
    CreateResultPart,
    Gang,
    ResultPart,
    ResultPartBatch,
    ResultPartList,
    TaskCompletion,
)
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
    "DEFAULT_HEARTBEAT_SECONDS",
    "DEFAULT_LEASE_SECONDS",
    "ENDED_INSTANCE_STATES",
    "FRAGMENT",
    "INLINE_BYTES",
    "MAX_SECRET_CHARS",
    "MIN_SECRET_CHARS",
    "PROFILES",
    "STORED",
    "TERMINAL_STATES",
    "Accelerator",
    "Acquired",
    "Artifact",
    "ArtifactList",
    "ArtifactName",
    "Assignment",
    "BaseModel",
    "BlobRef",
    "CachedEnv",
    "CellSpec",
    "CreateResultPart",
    "CreateSession",
    "CreateToken",
    "CreatedToken",
    "Device",
    "EnvPhase",
    "EnvSpec",
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
    "Instance",
    "InstanceList",
    "InstanceState",
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
    "Offer",
    "Placement",
    "Provider",
    "ProviderConfig",
    "ProviderConfigError",
    "ProviderList",
    "Provisioning",
    "Registered",
    "Resources",
    "ResultPart",
    "ResultPartBatch",
    "ResultPartList",
    "Role",
    "Secret",
    "SecretList",
    "SecretName",
    "Session",
    "SessionList",
    "SessionSpec",
    "SetSecret",
    "Sha256",
    "StoredMetricPoint",
    "Task",
    "TaskCompletion",
    "TaskEnvironment",
    "TaskSample",
    "Telemetry",
    "TelemetrySample",
    "Token",
    "TokenList",
    "TokenState",
    "WaitAny",
    "Wheel",
    "Worker",
    "WorkerFit",
    "WorkerList",
    "WorkerRegistration",
    "WorkerState",
    "compute_capability_tuple",
    "format_duration",
    "gpu_model_matcher",
    "parse_duration",
    "parse_providers",
    "plain_text",
    "requirement",
]
