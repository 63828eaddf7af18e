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
``jobs?wait=S``                            POST    :class:`JobSpec` -> 201 :class:`Job`
``jobs/batch``                             POST    :class:`JobBatch` -> 201 :class:`JobList`
``jobs/wait``                              POST    :class:`WaitAny` -> :class:`JobList` (204)
``jobs/{id}/result``                       GET     -> bytes (a function job's outcomes)
``jobs?state=&limit=``                     GET     -> :class:`JobList`
``jobs/{id}``                              GET     -> :class:`Job`
``jobs/{id}/wait?timeout=S``               GET     -> :class:`Job` (200 when ended, 204)
``jobs/{id}/cancel``                       POST    -> :class:`Job` (409 when ended)
``jobs/{id}/interrupt``                    POST    -> :class:`Job` (a cell: SIGINT its kernel)
``sessions``                               GET     -> :class:`SessionList`
``sessions``                               POST    :class:`CreateSession` -> 201 :class:`Session`
``sessions/{name}``                        GET     -> :class:`Session`
``sessions/{name}``                        DELETE  -> 204 (end the session)
``jobs/{id}/events``                       GET     -> :class:`EventList`
``jobs/{id}/logs?offset=&limit=&wait=S``   GET     -> :class:`LogPage`
``jobs/{id}/artifacts``                    GET     -> :class:`ArtifactList`
``jobs/{id}/artifacts/{name}``             GET     -> bytes
``blobs``                                  POST    bytes -> 201 :class:`BlobRef`
``jobs/{id}/placement``                     GET     -> :class:`Placement`
``workers``                                GET     -> :class:`WorkerList`
``workers/{name}/drain`` (``resume``)      POST    -> :class:`Worker`
``workers/{name}/telemetry``               GET     -> :class:`Telemetry`
``workers/register``                       POST    :class:`WorkerRegistration` -> ``Registered``
``workers/{id}/heartbeat``                 POST    :class:`Heartbeat` -> :class:`HeartbeatReply`
``workers/{id}/acquire?wait=S``            POST    -> :class:`Acquired` (204 after the hold)
``tasks/{id}/logs``                        POST    :class:`LogBatch` -> :class:`LogAck`
``tasks/{id}/artifacts/{name}``            PUT     bytes -> 201 :class:`Artifact`
``tasks/{id}/result``                      PUT     bytes -> 201 :class:`BlobRef`
``tasks/{id}/complete``                    POST    :class:`TaskCompletion` -> :class:`Task`
``tasks/{id}/metrics``                     POST    :class:`MetricBatch` -> :class:`MetricAck`
``jobs/{id}/metrics?after=&limit=&wait=S`` GET     -> :class:`MetricPage`
``blobs/{sha256}``                         GET     -> bytes
``tokens``                                 GET     -> :class:`TokenList` (admin)
``tokens``                                 POST    :class:`CreateToken` -> 201 :class:`CreatedToken`
``tokens/{name}``                          DELETE  -> 204 (revoke)
=========================================  ======  =================================
"""

import enum
import re
from datetime import datetime
from typing import Annotated, Any, Literal

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
    function = "function"
    cell = "cell"
    session = "session"
    distributed = "distributed"


class LogStream(enum.StrEnum):
    """Where a log line came from; ``system`` lines are written by gpulayer itself."""

    stdout = "stdout"
    stderr = "stderr"
    system = "system"
    iopub = "iopub"  # a Jupyter message of a cell, as the JSON of a KernelMessage


Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\w.\-@ ]+$")]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[\w.\-/]+$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


# --------------------------------------------------------------------- jobs


#: Shorthands for common requirement sets (``profile="pytorch-cuda"``); explicit
#: fields given next to a profile win over the profile's values.
PROFILES: dict[str, dict[str, object]] = {
    "cpu": {"accelerator": "cpu", "gpus": 0},
    "pytorch-cpu": {"accelerator": "cpu", "gpus": 0},
    "pytorch-cuda": {"accelerator": "cuda", "gpus": 1},
    "pytorch-rocm": {"accelerator": "rocm", "gpus": 1},
    "pytorch-mps": {"accelerator": "mps", "gpus": 1, "gpu_memory_kind": "unified"},
}

Accelerator = Literal["cuda", "rocm", "mps", "cpu"]
_CC = re.compile(r"^\d+(\.\d+)?$")


def compute_capability_tuple(value: str) -> tuple[int, int]:
    """``"8.6"`` -> ``(8, 6)``, for comparisons."""
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


class Resources(_Request):
    """What one task needs from a worker.

    ``gpu_memory``, ``gpu_model``, ``min_compute_capability`` and
    ``gpu_memory_kind`` apply to each of the ``gpus`` reserved GPUs.
    ``selector`` lists worker labels that must match exactly.
    """

    profile: str | None = Field(None, description=f"one of {', '.join(PROFILES)}")
    gpus: int = Field(0, ge=0, le=64, description="number of whole GPUs")
    gpu_memory: ByteSize | None = Field(None, description="memory of each GPU, e.g. '40GiB'")
    gpu_model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = Field(
        None, description="regular expression on the GPU name, e.g. 'A100|H100'"
    )
    accelerator: Accelerator | None = None
    min_compute_capability: str | None = Field(None, description="CUDA compute capability, '8.0'")
    gpu_memory_kind: Literal["dedicated", "unified"] | None = None
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU cores (used for placement)")
    memory: ByteSize | None = Field(None, description="host memory, e.g. '8GiB'")
    selector: dict[LabelKey, Annotated[str, StringConstraints(max_length=256)]] = {}
    worker: Name | None = Field(None, description="run only on the worker with this name")

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("profile") is not None:
            profile = data["profile"]
            if profile not in PROFILES:
                raise ValueError(f"unknown profile {profile!r}; profiles are {', '.join(PROFILES)}")
            return {**PROFILES[profile], **{k: v for k, v in data.items() if v is not None}}
        return data

    @field_validator("gpu_model")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"{v!r} is not a regular expression: {e}") from e
        return v

    @field_validator("min_compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: object) -> object:
        if v is not None and not _CC.match(str(v)):
            raise ValueError(f"{v!r} is not a compute capability like '8.0'")
        return None if v is None else str(v)

    @model_validator(mode="after")
    def _consistent(self) -> "Resources":
        per_gpu = [
            name
            for name in ("gpu_memory", "gpu_model", "min_compute_capability", "gpu_memory_kind")
            if getattr(self, name) is not None
        ]
        if per_gpu and self.gpus == 0:
            raise ValueError(f"{', '.join(per_gpu)} needs gpus >= 1")
        if self.accelerator == "cpu" and self.gpus > 0:
            raise ValueError("accelerator 'cpu' contradicts gpus > 0")
        if self.min_compute_capability is not None and self.accelerator not in (None, "cuda"):
            raise ValueError("min_compute_capability applies to cuda GPUs only")
        if self.accelerator == "mps" and self.gpu_memory_kind == "dedicated":
            raise ValueError("mps GPUs have unified memory, not dedicated")
        return self


INLINE_BYTES = 256 * 1024
"""Payloads and results up to this size travel inline (base64 in JSON); larger ones
go through the blob store."""


_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


class FunctionCall(_Request):
    """The pickled call(s) of a ``function`` job (see :mod:`gpulayer.payload`).

    Exactly one of ``payload`` (inline; base64 in JSON) or ``payload_blob``
    (uploaded to ``blobs``).
    """

    model_config = _BASE64

    format: int = Field(ge=1, description="payload format version")
    python: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+$")] = Field(
        description="major.minor of the Python that pickled it"
    )
    name: Annotated[str, StringConstraints(max_length=512)] = Field(
        "", description="the function's qualified name, for people"
    )
    payload: bytes | None = Field(None, max_length=INLINE_BYTES)
    payload_blob: Sha256 | None = None
    calls: int = Field(1, ge=1, le=100_000, description="calls in the payload (map chunks)")
    retry_exceptions: bool = Field(
        False, description="retry when the function raises (not only on crashes and loss)"
    )

    @model_validator(mode="after")
    def _one_payload(self) -> "FunctionCall":
        if (self.payload is None) == (self.payload_blob is None):
            raise ValueError("give exactly one of 'payload' (inline) or 'payload_blob'")
        return self


Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]


class CellSpec(_Request):
    """The code of a ``cell`` job, run in a headless Jupyter kernel on the worker.

    ``session`` names a running session (its kernel, worker and GPUs); without
    it the cell gets a fresh kernel with the job's own resources. ``push`` is a
    ``values`` payload (:mod:`gpulayer.variables`) set in the kernel before the
    cell runs, inline or uploaded (``push_blob``); ``pull`` names the variables
    sent back as the job's result.
    """

    model_config = _BASE64

    source: Annotated[str, StringConstraints(max_length=1024 * 1024)]
    session: Name | None = None
    push: bytes | None = Field(None, max_length=INLINE_BYTES)
    push_blob: Sha256 | None = None
    pull: list[Identifier] = Field([], max_length=256)

    @model_validator(mode="after")
    def _one_push(self) -> "CellSpec":
        if self.push is not None and self.push_blob is not None:
            raise ValueError("give at most one of 'push' (inline) or 'push_blob'")
        return self


class SessionSpec(_Request):
    """A ``session`` job: a persistent kernel that holds its worker slot and GPUs
    until it is ended or has been idle (no cell) for ``idle_timeout`` seconds."""

    name: Name
    idle_timeout: float | None = Field(
        None, description="seconds or '30m'; default: the control plane's session_idle_seconds"
    )

    @field_validator("idle_timeout", mode="before")
    @classmethod
    def _idle(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)  # type: ignore[arg-type]


Launcher = Literal["torchrun", "direct"]


class JobSpec(_Request):
    """What a user submits.

    A ``command`` job gives exactly one of ``command`` (an argv list, run without
    a shell) or ``shell`` (a string run by ``/bin/sh -c``); a ``function`` job gives
    ``function`` and runs in one of the worker's warm Python runners; a
    ``distributed`` job gives ``command``, ``shell`` or a one-call ``function`` and
    runs it on every rank of a gang of ``nodes`` x ``nproc_per_node``; a ``cell``
    job gives ``cell`` and a ``session`` job ``session`` (both run in headless
    Jupyter kernels; a cell in a session ignores ``resources``).
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
    function: FunctionCall | None = None
    cell: CellSpec | None = None
    session: SessionSpec | None = None
    resources: Resources = Resources()
    timeout: float | None = Field(None, description="seconds, or a string like '10m'")
    retries: int = Field(0, ge=0, le=20, description="extra attempts after a failure or loss")
    priority: int = Field(0, ge=-1000, le=1000)
    labels: dict[LabelKey, Annotated[str, StringConstraints(max_length=256)]] = {}
    nodes: int = Field(
        1, ge=1, le=256, description="distributed: tasks placed together, one per worker"
    )
    nproc_per_node: int = Field(1, ge=1, le=64, description="distributed: processes per node")
    launcher: Launcher = Field(
        "torchrun", description="distributed: 'torchrun', or 'direct' (gpulayer starts the ranks)"
    )

    @property
    def world_size(self) -> int:
        """Processes of a distributed job in all (1 for other kinds)."""
        return self.nodes * self.nproc_per_node

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _one_program(self) -> "JobSpec":
        if self.kind != JobKind.distributed and (self.nodes > 1 or self.nproc_per_node > 1):
            raise ValueError("'nodes' and 'nproc_per_node' need kind 'distributed'")
        if self.kind in (JobKind.cell, JobKind.session):
            return self._kernel_program()
        if self.cell is not None or self.session is not None:
            raise ValueError("'cell' and 'session' need kind 'cell' or 'session'")
        if self.kind == JobKind.function:
            if self.function is None:
                raise ValueError("a 'function' job needs 'function' (the pickled call)")
            if self.command is not None or self.shell is not None:
                raise ValueError("a 'function' job takes no 'command' or 'shell'")
            return self
        if self.kind == JobKind.distributed and self.function is not None:
            if self.command is not None or self.shell is not None:
                raise ValueError("give one of 'command', 'shell' or 'function', not several")
            if self.function.calls != 1:
                raise ValueError("a distributed 'function' holds exactly one call")
            return self
        if self.function is not None:
            raise ValueError("'function' needs kind 'function' or 'distributed'")
        if (self.command is None) == (self.shell is None):
            raise ValueError("give exactly one of 'command' (argv list) or 'shell' (string)")
        return self

    def _kernel_program(self) -> "JobSpec":
        kind = self.kind.value
        if self.command is not None or self.shell is not None or self.function is not None:
            raise ValueError(f"a '{kind}' job takes no 'command', 'shell' or 'function'")
        mine, other = (self.cell, self.session) if kind == "cell" else (self.session, self.cell)
        if mine is None:
            raise ValueError(f"a '{kind}' job needs '{kind}'")
        if other is not None:
            raise ValueError(f"a '{kind}' job takes no '{'session' if kind == 'cell' else 'cell'}'")
        if self.retries and (kind == "session" or (self.cell and self.cell.session)):
            raise ValueError("a kernel's state cannot be retried: sessions take retries=0")
        return self

    @property
    def in_session(self) -> str | None:
        """The session a cell runs in (None for every other job)."""
        return self.cell.session if self.cell is not None else None


class JobBatch(_Request):
    """Several jobs submitted in one request (``POST jobs/batch``), all or none."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    jobs: list[JobSpec] = Field(min_length=1, max_length=1000)


class WaitAny(_Request):
    """``POST jobs/wait``: hold until at least one of ``ids`` has ended."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    ids: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=1000
    )
    timeout: float = Field(30.0, ge=0, le=300, description="seconds to hold")


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
    node_rank: int | None = Field(None, description="distributed: this task's node")


class Job(_Document):
    """A submitted job with its current state."""

    model_config = _BASE64

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
    result: bytes | None = Field(
        None, description="a function job's outcomes when small (only in single-job answers)"
    )
    result_size: int | None = Field(None, description="bytes of a function job's result")
    log_lines: int = Field(0, description="lines of output stored so far")
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
    rank: int | None = Field(None, description="distributed: the global rank that wrote it")


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
    rank: int | None = Field(None, ge=0, description="distributed: the global rank")


class LogBatch(_Request):
    """Lines of one task; ``seq`` numbers the first line within the task so a
    batch sent twice (after a lost answer) is stored once."""

    seq: int = Field(ge=0)
    lines: list[LogEntry] = Field(max_length=10000)


class LogAck(_Document):
    """How many of a task's lines the control plane now holds."""

    next_seq: int


# ------------------------------------------------------------------ metrics


MetricKey = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class MetricPoint(_Request):
    """One log point of a training run (a line of ``$GPULAYER_METRICS_FILE``)."""

    step: int | None = Field(None, ge=0)
    epoch: int | None = Field(None, ge=0)
    rank: int | None = Field(None, ge=0)
    ts: datetime
    metrics: dict[MetricKey, float] = Field(max_length=1000)


class MetricBatch(_Request):
    """Points of one task; ``seq`` numbers the first point within the task so a
    batch sent twice is stored once (as :class:`LogBatch`)."""

    seq: int = Field(ge=0)
    points: list[MetricPoint] = Field(max_length=10000)


class MetricAck(_Document):
    """How many of a task's metric points the control plane now holds."""

    next_seq: int


class StoredMetricPoint(_Document):
    """A stored point; ``seq`` numbers a job's points from 1, in arrival order."""

    seq: int
    task_id: str | None = None
    step: int | None = None
    epoch: int | None = None
    rank: int | None = None
    ts: datetime
    metrics: dict[str, float]


class MetricPage(_Document):
    """Points with ``seq`` greater than ``after``; ask again with ``after=next_after``."""

    api_version: str = API_VERSION
    points: list[StoredMetricPoint]
    next_after: int
    complete: bool = Field(description="the job ended and every point is stored")


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
    """One accelerator of a worker."""

    index: int = Field(ge=0)
    kind: Accelerator
    name: str
    memory_bytes: int = Field(0, ge=0)
    memory_kind: Literal["dedicated", "unified"] = "dedicated"
    uuid: str | None = None
    compute_capability: str | None = None
    driver_version: str | None = None
    runtime_version: str | None = Field(None, description="CUDA or ROCm version")
    simulated: bool = False


class GpuSample(_Request):
    """One GPU's readings at a heartbeat."""

    index: int
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


class TaskSample(_Request):
    """A running task's process tree at a heartbeat."""

    task_id: str
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    processes: int = 0


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
    python: Annotated[str, StringConstraints(max_length=32)] = Field(
        "", description="major.minor of the Python its function runners use"
    )
    running_tasks: list[str] = Field(
        [], description="task ids still running here (after a reconnect)"
    )
    address: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = Field(
        None, description="host or IP other workers reach this one at (gang rendezvous)"
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
    gpus: list[GpuSample] = []
    tasks: list[TaskSample] = []


class HeartbeatReply(_Document):
    """``kill_tasks``: tasks the control plane gave up on (stop them, report nothing);
    ``cancel``: tasks a user cancelled that still run (stop them, report ``cancelled``)."""

    kill_tasks: list[str] = []
    cancel: list[str] = []


class Gang(_Document):
    """Where one node of a distributed job stands in its gang: a static rendezvous
    on the rank-0 node (``master_addr:master_port``)."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int

    @property
    def world_size(self) -> int:
        """Processes in all."""
        return self.nnodes * self.nproc_per_node


class Assignment(_Document):
    """A task handed to a worker."""

    task_id: str
    job_id: str
    attempt: int
    spec: JobSpec
    gpu_indices: list[int] = []
    gang: Gang | None = Field(None, description="distributed jobs: the rendezvous")


class Acquired(_Document):
    """New assignments and cancel requests for one worker."""

    api_version: str = API_VERSION
    assignments: list[Assignment] = []
    cancel: list[str] = Field([], description="task ids to stop")
    interrupt: list[str] = Field([], description="cell task ids whose kernel gets SIGINT")


class TaskCompletion(_Request):
    """How a task ended, as the worker saw it (``lost``: the worker gave it up,
    e.g. while shutting down; it is retried like a task of a vanished worker)."""

    model_config = _BASE64

    state: Literal["succeeded", "failed", "cancelled", "timed_out", "lost"]
    exit_code: int | None = None
    reason: Annotated[str, StringConstraints(max_length=4096)] | None = None
    result: bytes | None = Field(
        None, max_length=INLINE_BYTES, description="a function task's outcomes, inline"
    )
    result_blob: Sha256 | None = Field(
        None, description="a function task's outcomes, PUT to tasks/{id}/result first"
    )
    retry: bool = Field(True, description="false: a failure that retrying cannot change")


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
    python: str = ""
    address: str | None = None
    registered_at: datetime
    last_heartbeat: datetime | None = None
    running_tasks: list[str] = []
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None
    gpus: list[GpuSample] = Field([], description="the latest GPU readings")
    tasks: list[TaskSample] = Field([], description="the latest per-task readings")


class WorkerList(_Document):
    """All known workers."""

    api_version: str = API_VERSION
    workers: list[Worker]


class TelemetrySample(_Document):
    """One heartbeat's readings of a worker."""

    ts: datetime
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None
    gpus: list[GpuSample] = []
    tasks: list[TaskSample] = []


class Telemetry(_Document):
    """A worker's recent readings, oldest first (a bounded window)."""

    api_version: str = API_VERSION
    worker_id: str
    worker_name: str
    samples: list[TelemetrySample]


class WorkerFit(_Document):
    """Whether a job fits one worker now, and if not, why."""

    worker: str
    fits: bool
    could_ever_fit: bool
    reason: str


class Placement(_Document):
    """Why a job runs where it does, or why it waits (``GET jobs/{id}/placement``)."""

    api_version: str = API_VERSION
    job_id: str
    state: JobState
    satisfiable: bool = Field(description="some registered worker could ever run it")
    summary: str
    workers: list[WorkerFit] = []


# ----------------------------------------------------------------- sessions


class CreateSession(_Request):
    """``POST sessions``: start a persistent kernel on a worker that fits."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    name: Name
    resources: Resources = Resources()
    idle_timeout: float | None = Field(None, description="seconds or '30m'")
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    labels: dict[LabelKey, Annotated[str, StringConstraints(max_length=256)]] = {}

    @field_validator("idle_timeout", mode="before")
    @classmethod
    def _idle(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)  # type: ignore[arg-type]


class Session(_Document):
    """A session as users see it: its job, where its kernel runs, when it expires."""

    api_version: str = API_VERSION
    name: str
    job_id: str
    state: JobState
    reason: str | None = None
    owner: str
    worker_name: str | None = None
    gpu_indices: list[int] = []
    idle_timeout: float
    created_at: datetime
    started_at: datetime | None = None
    last_activity: datetime | None = Field(None, description="when the last cell ended")
    cells: int = Field(0, description="cells run in it so far")


class SessionList(_Document):
    """The sessions that have not ended, oldest first."""

    api_version: str = API_VERSION
    sessions: list[Session]


class KernelMessage(_Document):
    """One relayed Jupyter iopub message: the text of a ``LogStream.iopub`` line.

    ``msg_type`` is one of ``stream``, ``display_data``, ``update_display_data``,
    ``execute_result``, ``error``, ``clear_output``, or gpulayer's own
    ``execute_reply`` (the cell is done; ``content`` is the kernel's reply).
    A message longer than a log line travels as several lines: each but the
    last starts with ``~`` (:data:`FRAGMENT`) and the client joins them.
    """

    msg_type: str
    content: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    transient: dict[str, Any] = {}


FRAGMENT = "~"
"""Prefix of an ``iopub`` line that the next ``iopub`` line continues."""


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


# ------------------------------------------------- tokens (issue 7: security)

#: ``admin`` everything; ``submitter`` its own jobs; ``viewer`` read-only;
#: ``join`` registers workers; ``worker`` is issued at registration only.
Role = Literal["admin", "submitter", "viewer", "join", "worker"]
TokenState = Literal["active", "expired", "revoked", "used"]


class CreateToken(_Request):
    """``POST tokens``: mint a named token (admin only)."""

    name: Name
    role: Literal["admin", "submitter", "viewer", "join"]
    expires: float | None = Field(None, description="lifetime: seconds or '30d', '12h'")
    single_use: bool = Field(False, description="join tokens only: one registration")

    @field_validator("expires", mode="before")
    @classmethod
    def _expires(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _single_use_join(self) -> "CreateToken":
        if self.single_use and self.role != "join":
            raise ValueError("only join tokens can be single-use")
        return self


class Token(_Document):
    """A token's record; the secret itself is never stored or listed."""

    id: str
    name: str
    role: Role
    state: TokenState
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    single_use: bool = False
    worker_id: str | None = None


class CreatedToken(Token):
    """The answer to ``POST tokens``: the record plus the secret, shown this once."""

    token: str


class TokenList(_Document):
    """``GET tokens``."""

    api_version: str = API_VERSION
    tokens: list[Token]
