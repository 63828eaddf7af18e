"""Frozen typed records: what the store answers (never a ``sqlite3.Row``).

Each record mirrors one table row, with states as enums, flags as ``bool`` and
JSON columns that every reader needs (GPU indices) already parsed. Times stay
UNIX seconds; :func:`as_datetime` and the ``model`` methods turn records into
contract models for the wire.
"""

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpulayer.contracts import (
    STORED,
    TERMINAL_STATES,
    Artifact,
    Event,
    Instance,
    InstanceState,
    Job,
    JobSpec,
    JobState,
    Task,
    TaskEnvironment,
    Worker,
    WorkerState,
)
from gpulayer.contracts.providers import cost_of

#: States that hold a worker's slot and GPUs.
ACTIVE_STATES = frozenset({JobState.scheduled, JobState.running})

#: Stored state values to their enum members (a lookup: ``JobState(value)`` costs
#: ten times more, and placement reads every active task on every pass).
_JOB_STATES: dict[str, JobState] = {s.value: s for s in JobState}
_WORKER_STATES: dict[str, WorkerState] = {s.value: s for s in WorkerState}


def gpu_indices(text: str | None) -> tuple[int, ...]:
    """A stored ``gpu_indices`` column (a JSON list the control plane wrote)."""
    return tuple(json.loads(text)) if text and text != "[]" else ()


#: The latest time a datetime can show (a stored time beyond it is shown as this).
_LAST_TS = datetime(9999, 12, 30, tzinfo=UTC).timestamp()


def as_datetime(ts: float) -> datetime:
    """A stored UNIX time as an aware UTC datetime; a time no datetime can hold
    (an infinite or absurd expiry stored by an older version) is clamped, so the
    row stays readable."""
    if ts != ts:  # NaN
        ts = 0.0
    return datetime.fromtimestamp(min(max(ts, 0.0), _LAST_TS), UTC)


def as_optional_datetime(ts: float | None) -> datetime | None:
    """:func:`as_datetime` for a time that may be missing."""
    return None if ts is None else as_datetime(ts)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A ``jobs`` row."""

    seq: int
    id: str
    spec_json: str
    state: JobState
    reason: str | None
    owner: str
    priority: int
    exit_code: int | None
    attempts: int
    worker_id: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None
    log_count: int

    @property
    def ended(self) -> bool:
        """Whether the job reached a terminal state."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "JobRecord":
        """Read a ``jobs`` row."""
        return cls(
            r["seq"], r["id"], r["spec"], _JOB_STATES[r["state"]], r["reason"], r["owner"],
            r["priority"], r["exit_code"], r["attempts"], r["worker_id"], r["created_at"],
            r["updated_at"], r["started_at"], r["ended_at"], r["log_count"],
        )  # fmt: skip

    def model(
        self, tasks: "list[TaskRecord]", names: dict[str, str], spec: JobSpec | None = None
    ) -> Job:
        """The job as a :class:`~gpulayer.contracts.Job` (``spec`` when already parsed)."""
        return Job(
            id=self.id,
            spec=spec or JobSpec.model_validate_json(self.spec_json, context=STORED),
            state=self.state,
            reason=self.reason,
            owner=self.owner,
            exit_code=self.exit_code,
            attempts=self.attempts,
            worker_id=self.worker_id,
            worker_name=names.get(self.worker_id or ""),
            created_at=as_datetime(self.created_at),
            updated_at=as_datetime(self.updated_at),
            started_at=as_optional_datetime(self.started_at),
            ended_at=as_optional_datetime(self.ended_at),
            tasks=[t.model(names) for t in tasks],
            log_lines=self.log_count,
            result=None,
            result_size=None,
            pending_reasons=[],
        )


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A ``tasks`` row (``gang_json`` is the rendezvous of a distributed job's node)."""

    id: str
    job_id: str
    attempt: int
    state: JobState
    worker_id: str | None
    gpu_indices: tuple[int, ...]
    exit_code: int | None
    reason: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    lease_expires: float | None
    cancel_requested: bool
    log_seq: int
    node_rank: int | None
    gang_json: str | None
    metric_seq: int
    environment_json: str | None = None

    @property
    def ended(self) -> bool:
        """Whether the task reached a terminal state."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "TaskRecord":
        """Read a ``tasks`` row."""
        return cls(
            r["id"], r["job_id"], r["attempt"], _JOB_STATES[r["state"]], r["worker_id"],
            gpu_indices(r["gpu_indices"]), r["exit_code"],
            r["reason"], r["created_at"], r["started_at"], r["ended_at"], r["lease_expires"],
            bool(r["cancel_requested"]), r["log_seq"], r["node_rank"], r["gang"],
            r["metric_seq"], r["environment"],
        )  # fmt: skip

    def model(self, names: dict[str, str] | None = None) -> Task:
        """The task as a :class:`~gpulayer.contracts.Task`."""
        return Task(
            id=self.id,
            job_id=self.job_id,
            attempt=self.attempt,
            state=self.state,
            worker_id=self.worker_id,
            worker_name=(names or {}).get(self.worker_id or ""),
            gpu_indices=list(self.gpu_indices),
            exit_code=self.exit_code,
            reason=self.reason,
            created_at=as_datetime(self.created_at),
            started_at=as_optional_datetime(self.started_at),
            ended_at=as_optional_datetime(self.ended_at),
            node_rank=self.node_rank,
            environment=(
                None
                if self.environment_json is None
                else TaskEnvironment.model_validate_json(self.environment_json)
            ),
        )


@dataclass(frozen=True, slots=True)
class Hold:
    """What an active task holds on its worker: a slot and its GPUs (all placement
    reads of a task, on every pass and every explanation)."""

    job_id: str
    worker_id: str | None
    gpu_indices: tuple[int, ...]
    #: ``scheduled`` (placed, not started yet), else ``running``.
    scheduled: bool = False


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A ``workers`` row (``info_json``: the registration's hardware and labels)."""

    id: str
    name: str
    hostname: str
    state: WorkerState
    info_json: str
    registered_at: float
    last_heartbeat: float | None
    cpu_percent: float | None
    memory_used: int | None
    draining: bool

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "WorkerRecord":
        """Read a ``workers`` row."""
        return cls(
            r["id"], r["name"], r["hostname"], _WORKER_STATES[r["state"]], r["info"],
            r["registered_at"], r["last_heartbeat"], r["cpu_percent"], r["memory_used"],
            bool(r["draining"]),
        )  # fmt: skip

    @property
    def info(self) -> dict[str, Any]:
        """The parsed registration details."""
        value = json.loads(self.info_json)
        assert isinstance(value, dict)
        return value

    def model(self, running: list[str]) -> Worker:
        """The worker as a :class:`~gpulayer.contracts.Worker`."""
        return Worker(
            id=self.id,
            name=self.name,
            hostname=self.hostname,
            state=self.state,
            registered_at=as_datetime(self.registered_at),
            last_heartbeat=as_optional_datetime(self.last_heartbeat),
            running_tasks=running,
            cpu_percent=self.cpu_percent,
            memory_used_bytes=self.memory_used,
            **self.info,
        )


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A ``tokens`` row (the hash, never the token)."""

    id: str
    name: str
    role: str
    hash: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    worker_id: str | None
    single_use: bool
    used_at: float | None
    task_id: str | None = None  # a task's own token (api_access)
    instance_id: str | None = None  # a provider instance's join token (its worker name only)

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "TokenRecord":
        """Read a ``tokens`` row."""
        return cls(
            r["id"], r["name"], r["role"], r["hash"], r["created_at"], r["expires_at"],
            r["revoked_at"], r["worker_id"], bool(r["single_use"]), r["used_at"], r["task_id"],
            r["instance_id"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class EventRecord:
    """An ``events`` row: a state change (or a request such as ``cancel_requested``)."""

    seq: int
    job_id: str
    task_id: str | None
    ts: float
    state: str
    reason: str | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "EventRecord":
        """Read an ``events`` row."""
        return cls(r["seq"], r["job_id"], r["task_id"], r["ts"], r["state"], r["reason"])

    def model(self) -> Event:
        """The event as a :class:`~gpulayer.contracts.Event`."""
        return Event(
            seq=self.seq,
            job_id=self.job_id,
            task_id=self.task_id,
            ts=as_datetime(self.ts),
            state=self.state,
            reason=self.reason,
        )


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """An ``artifacts`` row."""

    job_id: str
    name: str
    sha256: str
    size: int
    created_at: float

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "ArtifactRecord":
        """Read an ``artifacts`` row."""
        return cls(r["job_id"], r["name"], r["sha256"], r["size"], r["created_at"])

    def model(self) -> Artifact:
        """The artifact as a :class:`~gpulayer.contracts.Artifact`."""
        return Artifact(
            name=self.name,
            sha256=self.sha256,
            size=self.size,
            created_at=as_datetime(self.created_at),
        )


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """A ``results`` row: a job's pickled outcomes, ``inline`` or as blob ``sha256``."""

    job_id: str
    task_id: str
    inline: bytes | None
    sha256: str | None
    size: int

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "ResultRecord":
        """Read a ``results`` row."""
        inline = bytes(r["inline"]) if r["inline"] is not None else None
        return cls(r["job_id"], r["task_id"], inline, r["sha256"], r["size"])


@dataclass(frozen=True, slots=True)
class MetricRecord:
    """A ``metrics`` row: one training metric point (``metrics_json`` its values)."""

    job_id: str
    seq: int
    task_id: str | None
    rank: int | None
    step: int | None
    epoch: int | None
    ts: float
    metrics_json: str

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "MetricRecord":
        """Read a ``metrics`` row."""
        return cls(
            r["job_id"], r["seq"], r["task_id"], r["rank"], r["step"], r["epoch"], r["ts"],
            r["metrics"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """An ``idempotency_keys`` row: the jobs one owner's submit with ``key`` created,
    and the ``digest`` of that request's specs."""

    owner: str
    key: str
    digest: str
    job_ids: tuple[str, ...]
    created_at: float

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "IdempotencyRecord":
        """Read an ``idempotency_keys`` row."""
        ids = tuple(json.loads(r["job_ids"]))
        return cls(r["owner"], r["key"], r["digest"], ids, r["created_at"])


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """An ``instances`` row: what gpulayer asked a provider for (docs/providers.md)."""

    id: str
    provider: str
    offer: str
    state: InstanceState
    external_id: str | None
    workers: tuple[str, ...]
    nodes: int
    gpus: int
    slots: int
    job_ids: tuple[str, ...]
    price_per_hour: float
    reason: str | None
    detail: str | None
    created_at: float
    booted_at: float | None
    ready_at: float | None
    idle_since: float | None
    ends_at: float | None
    ended_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "InstanceRecord":
        """Read an ``instances`` row."""
        return cls(
            r["id"], r["provider"], r["offer"], InstanceState(r["state"]), r["external_id"],
            tuple(json.loads(r["workers"])), r["nodes"], r["gpus"], r["slots"],
            tuple(json.loads(r["job_ids"])), r["price_per_hour"], r["reason"], r["detail"],
            r["created_at"], r["booted_at"], r["ready_at"], r["idle_since"], r["ends_at"],
            r["ended_at"],
        )  # fmt: skip

    def cost(self, now: float) -> float:
        """Price x wall time from creation to the end (or ``now``), by the second."""
        return cost_of(self.price_per_hour, (self.ended_at or now) - self.created_at)

    def model(self, now: float) -> Instance:
        """The instance as a :class:`~gpulayer.contracts.Instance`."""
        return Instance(
            id=self.id, provider=self.provider, offer=self.offer, state=self.state,
            external_id=self.external_id, workers=list(self.workers), nodes=self.nodes,
            gpus=self.gpus, job_ids=list(self.job_ids), reason=self.reason, detail=self.detail,
            price_per_hour=self.price_per_hour, cost=round(self.cost(now), 6),
            created_at=as_datetime(self.created_at), ready_at=as_optional_datetime(self.ready_at),
            ended_at=as_optional_datetime(self.ended_at),
            age_seconds=max(0.0, (self.ended_at or now) - self.created_at),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """A ``provider_intents`` row: a provider call written before it is made."""

    seq: int
    instance_id: str
    provider: str
    action: str  # "create" or "terminate"
    created_at: float
    outcome: str | None
    outcome_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "IntentRecord":
        """Read a ``provider_intents`` row."""
        return cls(
            r["seq"], r["instance_id"], r["provider"], r["action"], r["created_at"],
            r["outcome"], r["outcome_at"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunSpan:
    """A task's time on an instance's worker, for cost attribution."""

    job_id: str
    instance_id: str
    started_at: float
    ended_at: float | None
    gpus: int
    instance_gpus: int
    price_per_hour: float
