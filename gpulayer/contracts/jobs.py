"""Jobs: what a user submits (:class:`JobSpec` and its programs), and what it reads back."""

import enum
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from .base import (
    API_VERSION,
    BASE64_BYTES,
    INLINE_BYTES,
    DocumentModel,
    EnvName,
    Identifier,
    LabelKey,
    LabelValue,
    Name,
    OptionalDuration,
    RequestModel,
    Sha256,
    plain_text,
)
from .environments import EnvSpec, TaskEnvironment
from .providers import Provisioning
from .resources import Resources
from .secrets import SecretNames


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


class JobKind(enum.StrEnum):
    """What a job runs."""

    command = "command"
    function = "function"
    cell = "cell"
    session = "session"
    distributed = "distributed"


class FunctionCall(RequestModel):
    """The pickled call(s) of a ``function`` job (see :mod:`gpulayer.payload`).

    Exactly one of ``payload`` (inline; base64 in JSON) or ``payload_blob``
    (uploaded to ``blobs``).
    """

    model_config = BASE64_BYTES

    format: int = Field(ge=1, description="payload format version")
    python: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+$")] = Field(
        description="major.minor of the Python that pickled it"
    )
    name: Annotated[str, StringConstraints(max_length=512), AfterValidator(plain_text)] = Field(
        default="", description="the function's qualified name, for people"
    )
    payload: bytes | None = Field(default=None, max_length=INLINE_BYTES)
    payload_blob: Sha256 | None = None
    calls: int = Field(default=1, ge=1, le=100_000, description="calls in the payload (map chunks)")
    retry_exceptions: bool = Field(
        default=False, description="retry when the function raises (not only on crashes and loss)"
    )

    @model_validator(mode="after")
    def _one_payload(self) -> "FunctionCall":
        if (self.payload is None) == (self.payload_blob is None):
            raise ValueError("give exactly one of 'payload' (inline) or 'payload_blob'")
        return self


class CellSpec(RequestModel):
    """The code of a ``cell`` job, run in a headless Jupyter kernel on the worker.

    ``session`` names a running session (its kernel, worker and GPUs); without
    it the cell gets a fresh kernel with the job's own resources. ``push`` is a
    ``values`` payload (:mod:`gpulayer.variables`) set in the kernel before the
    cell runs, inline or uploaded (``push_blob``); ``pull`` names the variables
    sent back as the job's result.
    """

    model_config = BASE64_BYTES

    source: Annotated[str, StringConstraints(max_length=1024 * 1024)]
    session: Name | None = None
    push: bytes | None = Field(default=None, max_length=INLINE_BYTES)
    push_blob: Sha256 | None = None
    pull: list[Identifier] = Field(default=[], max_length=256)

    @model_validator(mode="after")
    def _one_push(self) -> "CellSpec":
        if self.push is not None and self.push_blob is not None:
            raise ValueError("give at most one of 'push' (inline) or 'push_blob'")
        return self


class SessionSpec(RequestModel):
    """A ``session`` job: a persistent kernel that holds its worker slot and GPUs
    until it is ended or has been idle (no cell) for ``idle_timeout`` seconds."""

    name: Name
    idle_timeout: OptionalDuration = Field(
        default=None,
        description="seconds or '30m'; default: the control plane's session_idle_seconds",
    )
    relay: bool = Field(
        default=False,
        description="its Jupyter channels are relayed to one attached client; no cells"
        " (a gpulayer kernel started from a kernelspec: docs/kernels.md)",
    )


Launcher = Literal["torchrun", "direct"]


class JobSpec(RequestModel):
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
        default=None, min_length=1, max_length=4096
    )
    shell: Annotated[str, StringConstraints(min_length=1, max_length=262144)] | None = None
    env: dict[EnvName, str] = {}
    bundle: Sha256 | None = Field(
        default=None,
        description="sha256 of a tar.gz uploaded to /blobs, unpacked as the task's cwd",
    )
    function: FunctionCall | None = None
    cell: CellSpec | None = None
    session: SessionSpec | None = None
    resources: Resources = Field(
        default_factory=Resources, description="what each task needs; default: 1 CPU, no GPU"
    )
    timeout: OptionalDuration = Field(default=None, description="seconds, or a string like '10m'")
    retries: int = Field(
        default=0, ge=0, le=20, description="extra attempts after a failure or loss"
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    labels: dict[LabelKey, LabelValue] = {}
    nodes: int = Field(
        default=1, ge=1, le=256, description="distributed: tasks placed together, one per worker"
    )
    nproc_per_node: int = Field(
        default=1, ge=1, le=64, description="distributed: processes per node"
    )
    launcher: Launcher = Field(
        default="torchrun",
        description="distributed: 'torchrun', or 'direct' (gpulayer starts the ranks)",
    )
    api_access: bool = Field(
        default=False,
        description="the task may call gpulayer (nested submits): it gets GPULAYER_URL and a"
        " GPULAYER_TOKEN of the job's owner, role submitter at most, valid while it runs",
    )
    queue_timeout: OptionalDuration = Field(
        default=None,
        description="longest wait in the queue, e.g. '10m': a job not started by then ends"
        " timed_out, its reason naming why it waited (default: no limit)",
    )
    secrets: SecretNames = Field(
        default=[],
        max_length=64,
        description="names of the owner's secrets the task gets as environment variables"
        " (values never appear in a read; docs/secrets.md)",
    )
    environment: EnvSpec | None = Field(
        default=None,
        description="the Python packages it runs with, built on the worker and cached"
        " (docs/environments.md); a cell in a session runs in its session's",
    )

    @property
    def world_size(self) -> int:
        """Processes of a distributed job in all (1 for other kinds)."""
        return self.nodes * self.nproc_per_node

    @model_validator(mode="after")
    def _secrets_apart_from_env(self) -> "JobSpec":
        if both := sorted(set(self.secrets) & set(self.env)):
            raise ValueError(f"{both[0]!r} is both in 'env' and in 'secrets'; name it once")
        return self

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
        if self.cell is not None and self.cell.session and self.environment is not None:
            raise ValueError(
                "a cell in a session runs in its session's environment: give 'environment'"
                " when the session starts"
            )
        if self.retries and (kind == "session" or (self.cell and self.cell.session)):
            raise ValueError("a kernel's state cannot be retried: sessions take retries=0")
        return self

    @property
    def in_session(self) -> str | None:
        """The session a cell runs in (None for every other job)."""
        return self.cell.session if self.cell is not None else None


class JobBatch(RequestModel):
    """Several jobs submitted in one request (``POST jobs/batch``), all or none."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    jobs: list[JobSpec] = Field(min_length=1, max_length=1000)


class WaitAny(RequestModel):
    """``POST jobs/wait``: hold until at least one of ``ids`` has ended."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    ids: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=1000
    )
    timeout: float = Field(default=30.0, ge=0, le=300, description="seconds to hold")


class Task(DocumentModel):
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
    node_rank: int | None = Field(default=None, description="distributed: this task's node")
    environment: TaskEnvironment | None = Field(
        default=None, description="its env: preparing, ready (exact versions) or failed"
    )


class JobEnd(DocumentModel):
    """How a job ended (or stands) and its small result: what a caller that waited
    for it reads. ``POST jobs?wait=S&answer=end`` answers it instead of the whole
    ``Job``, and it reads from a ``Job`` document too, skipping its spec and tasks
    (a warm ``.run`` reads nothing else)."""

    model_config = BASE64_BYTES

    id: str
    state: JobState
    reason: str | None = None
    exit_code: int | None = None
    worker_name: str | None = None
    result: bytes | None = None
    result_size: int | None = None
    log_lines: int = 0
    result_parts: int = 0

    @classmethod
    def of(cls, job: "Job") -> "JobEnd":
        """The end of ``job``, as read from it."""
        return cls.model_validate(job, from_attributes=True)


class Job(DocumentModel):
    """A submitted job with its current state."""

    model_config = BASE64_BYTES

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
        default=None,
        description="a function job's outcomes when small (only in single-job answers)",
    )
    result_size: int | None = Field(default=None, description="bytes of a function job's result")
    log_lines: int = Field(default=0, description="lines of output stored so far")
    result_parts: int = Field(
        default=0,
        description="a function job of several calls: outcomes kept apart from its result"
        " (calls an attempt finished before its worker died; GET jobs/{id}/parts)",
    )
    pending_reasons: list[str] = Field(
        default=[], description="while queued: per worker, why the job does not fit there"
    )
    unsatisfiable: bool = Field(
        default=False,
        description="while queued: no registered worker could ever run it (``reason`` says"
        " why); it waits for a worker that could",
    )
    provisioning: Provisioning | None = Field(
        default=None,
        description="while queued: the instance a provider is starting for it (docs/providers.md)",
    )
    cost: float | None = Field(
        default=None, description="its share of the provider instances it ran on (price x time)"
    )
    environment: TaskEnvironment | None = Field(
        default=None,
        description="the current attempt's env (only in single-job answers): preparing,"
        " or the exact versions it ran with",
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


class JobList(DocumentModel):
    """A page of jobs, newest first."""

    api_version: str = API_VERSION
    jobs: list[Job]


class Event(DocumentModel):
    """A state change of a job or task, with its reason."""

    seq: int
    job_id: str
    task_id: str | None = None
    ts: datetime
    state: str
    reason: str | None = None


class EventList(DocumentModel):
    """All events of one job, oldest first."""

    api_version: str = API_VERSION
    events: list[Event]
