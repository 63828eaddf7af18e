"""The provider interface: offers, create, terminate, list (docs/providers.md, ADR 0117).

A provider is an adapter over something that can start machines (this machine's
processes, a Slurm cluster, a simulated cloud; a cloud SDK or SkyPilot later). It
knows nothing of jobs: :class:`~jupyter_ext.instances.Instances` records each call
as an intent before and an outcome after, and the autoscaler decides what to ask.

Every instance a provider makes carries gpulayer's instance id (a Slurm job name,
a process's command line, a cloud tag), so :meth:`Provider.list` can say which of
the provider's instances are ours, also after a control-plane restart.
"""

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from gpulayer.contracts import Offer
from gpulayer.contracts.providers import LocalConfig, SimulatedConfig, SlurmConfig

AnyConfig = SimulatedConfig | LocalConfig | SlurmConfig


class CapacityError(Exception):
    """The provider has no capacity for this offer now (try another, back off)."""


class Refused(Exception):
    """The provider will never grant this request as asked; the message is its own."""


@dataclass(frozen=True)
class Launch:
    """What an instance needs to boot its worker(s)."""

    instance_id: str
    offer: Offer
    workers: tuple[str, ...]  # one worker name per node
    tokens: tuple[str, ...]  # one single-use join token per node
    url: str
    fingerprint: str | None = None
    gpus: int = 0  # per node
    cpus: int = 1
    memory_bytes: int = 0
    slots: int = 4
    labels: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None  # the job's timeout: an instance with a time limit outlives it

    @property
    def nodes(self) -> int:
        """How many nodes (workers) the instance has."""
        return len(self.workers)


@dataclass(frozen=True)
class Seen:
    """One of our instances as the provider reports it."""

    instance_id: str
    external_id: str
    state: Literal["pending", "running", "ended"]
    detail: str = ""
    ends_at: float | None = None  # when the provider will end it (a Slurm time limit)


class Provider(abc.ABC):
    """One configured provider (``[providers.NAME]``)."""

    kind: ClassVar[str]

    def __init__(
        self,
        name: str,
        config: AnyConfig,
        data_dir: Path,
        *,
        tag: str = "gl",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.config = config
        self.data_dir = data_dir
        self.tag = tag  # this control plane's mark on every instance it makes
        self.clock = clock

    @abc.abstractmethod
    def offers(self) -> list[Offer]:
        """The shapes this provider can create, with their prices."""

    @abc.abstractmethod
    async def create(self, launch: Launch) -> str:
        """Start an instance that runs ``gpulayer join`` with the launch's tokens;
        returns the provider's id for it.

        Raises
        ------
        CapacityError
            No capacity now (the autoscaler backs off and tries the next offer).
        Refused
            The request can never be met (the job is unsatisfiable with this message).
        """

    @abc.abstractmethod
    async def terminate(self, external_id: str) -> None:
        """End an instance (idempotent: an instance already gone is not an error)."""

    @abc.abstractmethod
    async def list(self) -> list[Seen]:
        """Our instances the provider still has or recently ended."""

    async def close(self) -> None:  # noqa: B027  (most providers hold nothing)
        """Let go of local resources (never terminates instances)."""
