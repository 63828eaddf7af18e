"""Providers and instances: capacity that comes and goes (docs/providers.md).

A *provider* (``local``, ``slurm``, ``simulated``; a cloud later) offers machine
shapes with prices (:class:`Offer`) and creates *instances* that boot a worker with
a single-use join token. An instance moves::

    provisioning ──▶ booting ──▶ ready ⇄ idle ──▶ terminating ──▶ gone
         │              │          │                                ▲
         └──────────────┴──────────┴──▶ lost | failed ──────────────┘ (never back)

The configuration of each provider (``gpulayer up --providers FILE.toml``, the
``c.GpulayerApp.providers`` trait) is one model per kind, checked by
:func:`parse_providers`, whose errors name the table and the key.
"""

import enum
import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field, StringConstraints, field_validator

from .base import (
    API_VERSION,
    DEFERRED,
    Accelerator,
    DocumentModel,
    Name,
    OptionalDuration,
    RequestModel,
)

GIB = 1024**3


class InstanceState(enum.StrEnum):
    """Life cycle of an instance (see the module docstring)."""

    provisioning = "provisioning"  # asked of the provider, not running yet (Slurm: PENDING)
    booting = "booting"  # running at the provider, its worker has not joined yet
    ready = "ready"  # its worker(s) joined and run tasks
    idle = "idle"  # joined, no task for a while (terminated after idle_timeout)
    terminating = "terminating"  # termination asked of the provider
    gone = "gone"  # terminated
    lost = "lost"  # the provider no longer has it (preempted, node failure, vanished)
    failed = "failed"  # never came up (capacity error, refused, boot timeout)

    @property
    def active(self) -> bool:
        """True while the instance costs money or may still join."""
        return self not in ENDED_INSTANCE_STATES


ENDED_INSTANCE_STATES = frozenset({InstanceState.gone, InstanceState.lost, InstanceState.failed})


class Offer(DocumentModel):
    """A machine shape a provider can create, with its price."""

    provider: str
    name: str
    gpus: int = 0
    gpu_model: str | None = None
    gpu_memory_bytes: int = 0
    accelerator: Accelerator = "cuda"
    cpus: int = 1
    memory_bytes: int = 0
    price_per_hour: float = 0.0
    region: str | None = Field(default=None, description="region, zone or Slurm partition")
    max_nodes: int = Field(default=1, description="nodes one instance may span (gangs)")
    sized_to_job: bool = Field(
        default=False,
        description="the instance asks for exactly the job's GPUs (Slurm --gres), up to"
        " ``gpus`` (0: no limit known here; the provider decides)",
    )


class Instance(DocumentModel):
    """A provider's instance as gpulayer records it (``GET instances``)."""

    id: str
    provider: str
    offer: str
    state: InstanceState
    external_id: str | None = Field(default=None, description="the provider's id (Slurm job id)")
    workers: list[str] = Field(default=[], description="names its worker(s) register under")
    nodes: int = 1
    gpus: int = 0
    job_ids: list[str] = Field(default=[], description="the jobs it was provisioned for")
    reason: str | None = None
    detail: str | None = Field(default=None, description="the provider's own word on it")
    price_per_hour: float = 0.0
    cost: float = Field(default=0.0, description="price x wall time so far (billed by the second)")
    created_at: datetime
    ready_at: datetime | None = None
    ended_at: datetime | None = None
    age_seconds: float = 0.0


class InstanceList(DocumentModel):
    """``GET instances``."""

    api_version: str = API_VERSION
    instances: list[Instance]


class Provider(DocumentModel):
    """A configured provider with its offers (``GET providers``)."""

    name: str
    kind: str
    min_instances: int
    max_instances: int
    idle_timeout_seconds: float
    boot_timeout_seconds: float
    active_instances: int = 0
    offers: list[Offer] = []
    backoff: dict[str, float] = Field(
        default={}, description="offer -> seconds until it is tried again (capacity errors)"
    )


class ProviderList(DocumentModel):
    """``GET providers``."""

    api_version: str = API_VERSION
    providers: list[Provider]


class Provisioning(DocumentModel):
    """What a queued job waits for: an instance being provisioned for it."""

    instance_id: str
    provider: str
    state: InstanceState
    detail: str = Field(description="e.g. 'slurm job 1234 pending (Resources) in partition gpu'")


# ------------------------------------------------------------------ configuration

ProviderName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,30}$")]
_GPU_SPEC = r"^(?:\d+\s*[xX]\s*)?(?:(?:cuda|rocm|mps):)?[A-Za-z0-9][\w.\- ]*-\d+(?:\.\d+)?\s*GB$"
GpuSpec = Annotated[str, StringConstraints(pattern=_GPU_SPEC)]


class _Common(RequestModel):
    """Options every kind has."""

    min_instances: int = Field(default=0, ge=0, le=1000)
    max_instances: int = Field(default=4, ge=0, le=1000)
    idle_timeout: OptionalDuration = Field(default=600.0, description="idle this long: terminate")
    boot_timeout: OptionalDuration = Field(
        default=600.0, description="not joined this long: terminate and provision again"
    )
    slots: int = Field(default=4, ge=1, le=1024, description="tasks each worker runs at once")
    labels: dict[str, str] = {}
    url: str | None = Field(
        default=None, description="the control plane's URL as the instances reach it"
    )

    @field_validator("idle_timeout", "boot_timeout")
    @classmethod
    def _positive(cls, v: float | None) -> float:
        if v is None or v <= 0:
            raise ValueError("must be a duration above 0")
        return v


class SimulatedOffer(RequestModel):
    """One shape of a ``simulated`` provider."""

    name: Name
    gpus: GpuSpec | Literal[""] = Field(default="", description="e.g. '1xA100-80GB'; '' none")
    cpus: int = Field(default=4, ge=1, le=1024)
    memory: float = Field(default=16.0, gt=0, description="GiB")
    price_per_hour: float = Field(default=0.0, ge=0)
    region: str = "sim-1"
    capacity_errors: int = Field(
        default=0, ge=-1, description="the first N creates fail with a capacity error (-1: all)"
    )
    boot_seconds: float = Field(default=0.0, ge=0, description="delay before the worker starts")
    vanish_after: float | None = Field(
        default=None, gt=0, description="the instance disappears this long after it booted"
    )
    max_nodes: int = Field(default=1, ge=1, le=64)
    create_seconds: float = Field(
        default=0.0, ge=0, description="the create call answers this late (the instance exists)"
    )


class SimulatedConfig(_Common):
    """``kind = "simulated"``: cloud-shaped instances that are local worker processes."""

    kind: Literal["simulated"]
    offers: list[SimulatedOffer] = Field(min_length=1)


class LocalConfig(_Common):
    """``kind = "local"``: workers as processes on this machine."""

    kind: Literal["local"]
    gpus: GpuSpec | Literal[""] | None = Field(
        default=None, description="GPULAYER_SIMULATED_GPUS for its workers (None: real ones)"
    )
    max_instances: int = Field(default=1, ge=0, le=1000)


class SlurmConfig(_Common):
    """``kind = "slurm"``: an sbatch allocation that runs ``gpulayer join``."""

    kind: Literal["slurm"]
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: OptionalDuration = Field(default=3600.0, description="the allocation's --time")
    gres: str = Field(default="gpu", description="GRES name for GPUs, or a fixed 'gpu:a100:2'")
    gpus_per_node: int = Field(
        default=0, ge=0, le=64, description="most GPUs a node has (0: let Slurm decide)"
    )
    gpu_model: str | None = None
    gpu_memory: float = Field(default=0.0, ge=0, description="GiB per GPU, when known")
    cpus_per_node: int = Field(default=1, ge=1, le=4096)
    memory_per_node: float = Field(default=0.0, ge=0, description="GiB, when known")
    max_nodes: int = Field(default=1, ge=1, le=1024, description="nodes a gang may span")
    price_per_hour: float = Field(default=0.0, ge=0, description="per node-hour")
    preamble: str = Field(default="", description="lines before `gpulayer join` (module load ...)")
    sbatch_args: list[str] = Field(default=[], description="extra sbatch options")
    drain_before_end: OptionalDuration = Field(
        default=300.0, description="--signal: drain the worker this long before the time limit"
    )
    python: str | None = Field(default=None, description="the Python on the nodes (default: ours)")
    workdir: str | None = Field(default=None, description="where job scripts and logs go")


ProviderConfig = Annotated[SimulatedConfig | LocalConfig | SlurmConfig, Field(discriminator="kind")]
_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ProviderConfig, config=DEFERRED)
_NAME: pydantic.TypeAdapter[str] = pydantic.TypeAdapter(ProviderName, config=DEFERRED)


class ProviderConfigError(ValueError):
    """A provider table that cannot be used; the message names the table and the key."""


def parse_providers(table: object) -> dict[str, SimulatedConfig | LocalConfig | SlurmConfig]:
    """The ``[providers.NAME]`` tables of a configuration, checked.

    ``table`` is the ``providers`` table itself (``{"gpu": {"kind": "slurm", ...}}``),
    or a whole file's content with a ``providers`` key.

    Raises
    ------
    ProviderConfigError
        One line: ``[providers.gpu] max_instances: Input should be ...``.
    """
    if isinstance(table, dict) and set(table) == {"providers"}:
        table = table["providers"]
    if not isinstance(table, dict):
        raise ProviderConfigError("[providers] must be a table of [providers.NAME] tables")
    out: dict[str, SimulatedConfig | LocalConfig | SlurmConfig] = {}
    for name, body in table.items():
        where = f"[providers.{name}]"
        try:
            _NAME.validate_python(name)
        except pydantic.ValidationError:
            raise ProviderConfigError(
                f"{where}: a provider name is lowercase letters, digits and '-' (at most 31)"
            ) from None
        if not isinstance(body, dict):
            raise ProviderConfigError(f"{where} must be a table")
        if "kind" not in body:
            raise ProviderConfigError(
                f'{where} kind: missing; one of "local", "slurm", "simulated"'
            )
        try:
            cfg = _ADAPTER.validate_python(body)
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            # union members ("constrained-str", "literal['']") are not keys
            loc = [str(p) for p in err["loc"] if not {"-", "["} & set(str(p))]
            if loc and loc[0] == body.get("kind"):
                loc = loc[1:]  # pydantic puts the union member first
            key = ".".join(loc) or "kind"
            raise ProviderConfigError(f"{where} {key}: {err['msg']}") from None
        if cfg.min_instances > cfg.max_instances:
            raise ProviderConfigError(
                f"{where} min_instances: {cfg.min_instances} is above max_instances"
                f" ({cfg.max_instances})"
            )
        out[name] = cfg
    return out


_GPU_ITEM = re.compile(
    r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?:(?P<kind>cuda|rocm|mps):)?(?P<model>.+?)-(?P<mem>\d+(?:\.\d+)?)\s*GB$"
)


def split_gpu_spec(spec: str) -> tuple[int, Accelerator, str | None, int]:
    """``(count, accelerator, model, memory_bytes)`` of a ``"2xA100-80GB"`` spec."""
    m = _GPU_ITEM.match(spec.strip())
    if m is None:
        return 0, "cuda", None, 0
    kind: Accelerator = m.group("kind") or "cuda"  # type: ignore[assignment]  # the pattern allows only kinds
    count = int(m.group("count") or 1)
    return count, kind, m.group("model").strip(), int(float(m.group("mem")) * GIB)


def cost_of(price_per_hour: float, seconds: float) -> float:
    """Price x wall time, billed by the started second."""
    return price_per_hour * math.ceil(max(0.0, seconds)) / 3600.0
