"""Wire contracts: every message that crosses a process boundary.

The control plane (``jupyter_ext``), the kernel-side client and the worker agent
import only this module to agree on shapes. Each model carries ``api_version``
when it is a top-level document; request models forbid unknown fields so a typo
in a client is a 400 naming the field, not a silently ignored option.

Routes (all under ``/gpulayer/api/v1/``):

=========================================  ======  =================================
route                                      verb    body -> answer
=========================================  ======  =================================
``health``                                 GET     -> :class:`Health`
``jobs``                                   POST    :class:`JobSpec` -> 201 :class:`Job`
``jobs?state=&limit=``                     GET     -> :class:`JobList`
``jobs/{id}``                              GET     -> :class:`Job`
``jobs/{id}/wait?timeout=S``               GET     -> :class:`Job` (200 when ended, 204)
``jobs/{id}/cancel``                       POST    -> :class:`Job` (409 when ended)
``jobs/{id}/events``                       GET     -> :class:`EventList`
``jobs/{id}/logs?offset=&limit=&wait=S``   GET     -> :class:`LogPage`
``jobs/{id}/artifacts``                    GET     -> :class:`ArtifactList`
``jobs/{id}/artifacts/{name}``             GET     -> bytes
``blobs``                                  POST    bytes -> 201 :class:`BlobRef`
``workers``                                GET     -> :class:`WorkerList`
``workers/register``                       POST    :class:`WorkerRegistration` -> ``Registered``
``workers/{id}/heartbeat``                 POST    :class:`Heartbeat` -> :class:`HeartbeatReply`
``workers/{id}/acquire?wait=S``            POST    -> :class:`Acquired` (204 after the hold)
``tasks/{id}/logs``                        POST    :class:`LogBatch` -> :class:`LogAck`
``tasks/{id}/artifacts/{name}``            PUT     bytes -> 201 :class:`Artifact`
``tasks/{id}/complete``                    POST    :class:`TaskCompletion` -> :class:`Task`
``blobs/{sha256}``                         GET     -> bytes
=========================================  ======  =================================
"""

import enum
import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

API_VERSION = "gpulayer.dev/v1alpha1"
API_PREFIX = "/gpulayer/api/v1"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``90``, ``"90s"``, ``"10m"``, ``"1.5h"`` or ``"2d"``.

    Raises
    ------
    ValueError
        For anything else, with a message that shows the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '90s', '10m', '2h'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(
                f"{value!r} is not a duration; use seconds or a string like '90s', '10m', '2h'"
            )
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def format_duration(seconds: float | None) -> str:
    """Short human form of a duration: ``850ms``, ``12.3s``, ``4m05s``, ``2h10m``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


class _Request(BaseModel):
    """Base of every request body: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class _Document(BaseModel):
    """Base of every answer: tolerant of fields added by newer servers."""

    model_config = ConfigDict(extra="ignore")


class JobState(enum.StrEnum):
    """Life cycle of a job (and of each of its tasks)."""

    queued = "queued"
    scheduled = "scheduled"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    timed_out = "timed_out"
    lost = "lost"

    @property
    def terminal(self) -> bool:
        """True once nothing more will happen to the job."""
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.timed_out, JobState.lost}
)


class WorkerState(enum.StrEnum):
    """Life cycle of a worker."""

    registering = "registering"
    ready = "ready"
    draining = "draining"
    unhealthy = "unhealthy"
    offline = "offline"


class JobKind(enum.StrEnum):
    """What a job runs."""

    command = "command"


class LogStream(enum.StrEnum):
    """Where a log line came from; ``system`` lines are written by gpulayer itself."""

    stdout = "stdout"
    stderr = "stderr"
    system = "system"


Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\w.\-@ ]+$")]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[\w.\-/]+$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


# --------------------------------------------------------------------- jobs


class Resources(_Request):
    """What one task needs from a worker."""

    gpus: int = Field(0, ge=0, le=64, description="number of whole GPUs")
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU cores (used for placement)")
    memory: ByteSize | None = Field(None, description="host memory, e.g. '8GiB'")


class JobSpec(_Request):
    """What a user submits.

    Exactly one of ``command`` (an argv list, run without a shell) or ``shell``
    (a string run by ``/bin/sh -c``) is given.
    """

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    kind: JobKind = JobKind.command
    name: Name | None = None
    command: list[Annotated[str, StringConstraints(max_length=65536)]] | None = Field(
        None, min_length=1, max_length=4096
    )
    shell: Annotated[str, StringConstraints(min_length=1, max_length=262144)] | None = None
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    bundle: Sha256 | None = Field(
        None, description="sha256 of a tar.gz uploaded to /blobs, unpacked as the task's cwd"
    )
    resources: Resources = Resources()
    timeout: float | None = Field(None, description="seconds, or a string like '10m'")
    retries: int = Field(0, ge=0, le=20, description="extra attempts after a failure or loss")
    priority: int = Field(0, ge=-1000, le=1000)
    labels: dict[LabelKey, Annotated[str, StringConstraints(max_length=256)]] = {}

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _one_program(self) -> "JobSpec":
        if (self.command is None) == (self.shell is None):
            raise ValueError("give exactly one of 'command' (argv list) or 'shell' (string)")
        return self


class Task(_Document):
    """One attempt of a job placed on one worker."""

    id: str
    job_id: str
    attempt: int
    state: JobState
    worker_id: str | None = None
    worker_name: str | None = None
    gpu_indices: list[int] = []
    exit_code: int | None = None
    reason: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None


class Job(_Document):
    """A submitted job with its current state."""

    api_version: str = API_VERSION
    id: str
    spec: JobSpec
    state: JobState
    reason: str | None = None
    owner: str
    exit_code: int | None = None
    attempts: int = 0
    worker_id: str | None = None
    worker_name: str | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    tasks: list[Task] = []
    pending_reasons: list[str] = Field(
        [], description="while queued: per worker, why the job does not fit there"
    )

    @property
    def name(self) -> str:
        """The job's name, or its id when it has none."""
        return self.spec.name or self.id

    @property
    def duration(self) -> float | None:
        """Seconds from start to end (or to now while running)."""
        if self.started_at is None:
            return None
        end = self.ended_at or datetime.now(self.started_at.tzinfo)
        return (end - self.started_at).total_seconds()


class JobList(_Document):
    """A page of jobs, newest first."""

    api_version: str = API_VERSION
    jobs: list[Job]


class Event(_Document):
    """A state change of a job or task, with its reason."""

    seq: int
    job_id: str
    task_id: str | None = None
    ts: datetime
    state: str
    reason: str | None = None


class EventList(_Document):
    """All events of one job, oldest first."""

    api_version: str = API_VERSION
    events: list[Event]


# --------------------------------------------------------------------- logs


class LogLine(_Document):
    """One line of a job's output; ``offset`` numbers a job's lines from 0."""

    offset: int
    stream: LogStream
    ts: datetime
    text: str
    task_id: str | None = None


class LogPage(_Document):
    """Lines from ``offset`` on. ``complete`` is true once the job ended and
    every line it will ever have is in the store."""

    api_version: str = API_VERSION
    lines: list[LogLine]
    next_offset: int
    complete: bool


class LogEntry(_Request):
    """One line as the worker ships it."""

    stream: LogStream
    ts: datetime
    text: Annotated[str, StringConstraints(max_length=65536)]


class LogBatch(_Request):
    """Lines of one task; ``seq`` numbers the first line within the task so a
    batch sent twice (after a lost answer) is stored once."""

    seq: int = Field(ge=0)
    lines: list[LogEntry] = Field(max_length=10000)


class LogAck(_Document):
    """How many of a task's lines the control plane now holds."""

    next_seq: int


# ---------------------------------------------------------------- artifacts


def _relative_name(name: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or "\x00" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError("must be a relative path without '.', '..' or empty parts")
    return name


ArtifactName = Annotated[
    str, StringConstraints(min_length=1, max_length=512), AfterValidator(_relative_name)
]


class Artifact(_Document):
    """A file a task produced, stored once by content."""

    name: str
    sha256: str
    size: int
    created_at: datetime


class ArtifactList(_Document):
    """The artifacts of one job."""

    api_version: str = API_VERSION
    artifacts: list[Artifact]


class BlobRef(_Document):
    """An uploaded blob (a source bundle, a large payload)."""

    sha256: str
    size: int


# ------------------------------------------------------------------ workers


class Device(_Request):
    """One accelerator (or the CPU) of a worker."""

    index: int = Field(ge=0)
    kind: Literal["cuda", "rocm", "mps", "cpu"]
    name: str
    memory_bytes: int = Field(0, ge=0)
    uuid: str | None = None
    simulated: bool = False


class WorkerRegistration(_Request):
    """What a worker tells the control plane when it joins (or re-joins)."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    name: Name
    hostname: str
    cpus: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    devices: list[Device] = []
    labels: dict[LabelKey, str] = {}
    slots: int = Field(4, ge=1, le=1024, description="tasks it runs at once")
    version: str
    running_tasks: list[str] = Field(
        [], description="task ids still running here (after a reconnect)"
    )


class Registered(_Document):
    """The answer to a registration: the worker's own token and timings."""

    api_version: str = API_VERSION
    worker_id: str
    token: str
    heartbeat_seconds: float
    lease_seconds: float
    kill_tasks: list[str] = Field([], description="running tasks the control plane gave up on")


class Heartbeat(_Request):
    """Sent every ``heartbeat_seconds``; renews the leases of running tasks."""

    running_tasks: list[str] = []
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None


class HeartbeatReply(_Document):
    """Tasks the worker should stop (cancelled, or given up on)."""

    kill_tasks: list[str] = []


class Assignment(_Document):
    """A task handed to a worker."""

    task_id: str
    job_id: str
    attempt: int
    spec: JobSpec
    gpu_indices: list[int] = []


class Acquired(_Document):
    """New assignments and cancel requests for one worker."""

    api_version: str = API_VERSION
    assignments: list[Assignment] = []
    cancel: list[str] = Field([], description="task ids to stop")


class TaskCompletion(_Request):
    """How a task ended, as the worker saw it."""

    state: Literal["succeeded", "failed", "cancelled", "timed_out"]
    exit_code: int | None = None
    reason: Annotated[str, StringConstraints(max_length=4096)] | None = None


class Worker(_Document):
    """A registered worker as users see it."""

    id: str
    name: str
    hostname: str
    state: WorkerState
    cpus: int
    memory_bytes: int
    devices: list[Device] = []
    labels: dict[str, str] = {}
    slots: int
    version: str
    registered_at: datetime
    last_heartbeat: datetime | None = None
    running_tasks: list[str] = []
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None


class WorkerList(_Document):
    """All known workers."""

    api_version: str = API_VERSION
    workers: list[Worker]


# ------------------------------------------------------------------- misc


class Health(_Document):
    """The control plane is up."""

    api_version: str = API_VERSION
    status: Literal["ok"] = "ok"
    version: str
    workers_ready: int = 0
    jobs_active: int = 0


class ErrorBody(_Document):
    """The JSON body of every 4xx/5xx answer."""

    code: str
    message: str
    field: str | None = None
