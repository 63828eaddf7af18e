"""Workers: registration, heartbeats, the fleet as users see it, and its telemetry."""

import enum
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from .base import (
    API_VERSION,
    Accelerator,
    DocumentModel,
    LabelKey,
    LabelValue,
    Name,
    RequestModel,
    plain_text,
)
from .environments import MAX_REPORTED_ENVS, CachedEnv

#: Ceilings of what a worker may report in one registration or heartbeat; the control
#: plane's traits (``max_heartbeat_devices``, ``max_heartbeat_tasks``) set the limits
#: in force, at most these.
MAX_DEVICES = 1024
MAX_TASKS = 4096
MAX_LABELS = 64

TaskId = Annotated[str, StringConstraints(min_length=1, max_length=64)]
ShortText = Annotated[str, StringConstraints(max_length=64)]
PortNumber = Annotated[int, Field(ge=1024, le=65535)]

#: How often workers heartbeat, unless the control plane says otherwise.
DEFAULT_HEARTBEAT_SECONDS = 2.0
#: How long a running task's lease lasts without a heartbeat that renews it.
DEFAULT_LEASE_SECONDS = 12.0


class WorkerState(enum.StrEnum):
    """Life cycle of a worker."""

    registering = "registering"
    ready = "ready"
    draining = "draining"
    unhealthy = "unhealthy"
    offline = "offline"


class Device(RequestModel):
    """One accelerator of a worker."""

    index: int = Field(ge=0, lt=MAX_DEVICES)
    kind: Accelerator
    name: Annotated[str, StringConstraints(max_length=256)]
    memory_bytes: int = Field(default=0, ge=0)
    memory_kind: Literal["dedicated", "unified"] = "dedicated"
    uuid: Annotated[str, StringConstraints(max_length=128)] | None = None
    compute_capability: (
        Annotated[str, StringConstraints(max_length=16, pattern=r"^\d+(\.\d+)?$")] | None
    ) = None
    driver_version: ShortText | None = None
    runtime_version: ShortText | None = Field(default=None, description="CUDA or ROCm version")
    simulated: bool = False


class GpuSample(RequestModel):
    """One GPU's readings at a heartbeat."""

    index: int
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


class TaskSample(RequestModel):
    """A running task's process tree at a heartbeat."""

    task_id: TaskId
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    processes: int = 0


class WorkerRegistration(RequestModel):
    """What a worker tells the control plane when it joins (or re-joins)."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    name: Name
    hostname: Annotated[str, StringConstraints(max_length=255)]
    cpus: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    devices: list[Device] = Field(default=[], max_length=MAX_DEVICES)
    labels: dict[LabelKey, LabelValue] = Field(default={}, max_length=MAX_LABELS)
    slots: int = Field(default=4, ge=1, le=1024, description="tasks it runs at once")
    version: ShortText
    python: Annotated[str, StringConstraints(max_length=32)] = Field(
        default="", description="major.minor of the Python its function runners use"
    )
    running_tasks: list[TaskId] = Field(
        default=[],
        max_length=MAX_TASKS,
        description="task ids still running here (after a reconnect)",
    )
    address: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = Field(
        default=None, description="host or IP other workers reach this one at (gang rendezvous)"
    )
    acquired_seq: int | None = Field(
        default=None,
        ge=0,
        description="the newest Acquired.seq this worker had taken in when it built this"
        " (None: it took none since it started); see Heartbeat.acquired_seq",
    )
    rendezvous_ports: tuple[PortNumber, PortNumber] | None = Field(
        default=None,
        description="the ports [low, high] a gang's rendezvous may use on this worker when"
        " it hosts node 0 (None: the control plane's default range)",
    )

    @field_validator("rendezvous_ports")
    @classmethod
    def _low_to_high(cls, ports: tuple[int, int] | None) -> tuple[int, int] | None:
        if ports is not None and ports[0] > ports[1]:
            raise ValueError("the low port comes first")
        return ports

    @field_validator("hostname", "version")
    @classmethod
    def _plain(cls, value: str) -> str:
        return plain_text(value)

    @field_validator("devices")
    @classmethod
    def _plain_device_names(cls, devices: list[Device]) -> list[Device]:
        """Device names hold no control or bidi characters (checked here, not in
        :class:`Device`, which answers share: a registration stored before the
        check still reads)."""
        for i, d in enumerate(devices):
            try:
                plain_text(d.name)
            except ValueError as e:
                raise ValueError(f"device {i}'s name {e}") from None
        return devices


class Registered(DocumentModel):
    """The answer to a registration: the worker's own token and timings."""

    api_version: str = API_VERSION
    worker_id: str
    token: str
    heartbeat_seconds: float
    lease_seconds: float
    kill_tasks: list[str] = Field(
        default=[], description="running tasks the control plane gave up on"
    )


class Heartbeat(RequestModel):
    """Sent every ``heartbeat_seconds``; renews the leases of running tasks."""

    running_tasks: list[TaskId] = Field(default=[], max_length=MAX_TASKS)
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None
    gpus: list[GpuSample] = Field(default=[], max_length=MAX_DEVICES)
    tasks: list[TaskSample] = Field(default=[], max_length=MAX_TASKS)
    acquired_seq: int | None = Field(
        default=None,
        ge=0,
        description="the newest Acquired.seq this worker had taken in when it built this"
        " heartbeat: a running task it does not list is over only if the answer that"
        " carried it is not newer (lost when it was listed before, else back to the"
        " queue: it never arrived); None: the older rule, a grace of 2 heartbeats",
    )
    log_lines: dict[TaskId, int] = Field(
        default={},
        max_length=MAX_TASKS,
        description="per running task: the log lines it produced so far (when the task"
        " is lost, the lines never delivered are recorded as a gap)",
    )
    envs: list[CachedEnv] = Field(
        default=[], max_length=MAX_REPORTED_ENVS, description="the envs it keeps, newest first"
    )


class HeartbeatReply(DocumentModel):
    """``kill_tasks``: tasks the control plane gave up on (stop them, report nothing);
    ``cancel``: tasks a user cancelled that still run (stop them, report ``cancelled``)."""

    kill_tasks: list[str] = []
    cancel: list[str] = []


class Worker(DocumentModel):
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
    rendezvous_ports: tuple[int, int] | None = None
    registered_at: datetime
    last_heartbeat: datetime | None = None
    running_tasks: list[str] = []
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None
    gpus: list[GpuSample] = Field(default=[], description="the latest GPU readings")
    tasks: list[TaskSample] = Field(default=[], description="the latest per-task readings")
    envs: list[CachedEnv] = Field(
        default=[], description="the envs it keeps (docs/environments.md)"
    )


class WorkerList(DocumentModel):
    """All known workers."""

    api_version: str = API_VERSION
    workers: list[Worker]


class TelemetrySample(DocumentModel):
    """One heartbeat's readings of a worker."""

    ts: datetime
    cpu_percent: float | None = None
    memory_used_bytes: int | None = None
    gpus: list[GpuSample] = []
    tasks: list[TaskSample] = []


class Telemetry(DocumentModel):
    """A worker's recent readings, oldest first (a bounded window)."""

    api_version: str = API_VERSION
    worker_id: str
    worker_name: str
    samples: list[TelemetrySample]
