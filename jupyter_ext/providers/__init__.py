"""Providers: where instances (machines that run ``gpulayer join``) come from.

``base`` is the interface (offers, create, terminate, list); ``simulated``,
``local`` and ``slurm`` implement it; :func:`build` makes one from its checked
configuration (``gpulayer.contracts.parse_providers``).
"""

from collections.abc import Callable
from pathlib import Path

from .base import AnyConfig, CapacityError, Launch, Provider, Refused, Seen
from .local import LocalProvider
from .simulated import SimulatedProvider
from .slurm import SlurmProvider

KINDS: dict[str, type[Provider]] = {
    "simulated": SimulatedProvider,
    "local": LocalProvider,
    "slurm": SlurmProvider,
}

__all__ = [
    "KINDS",
    "CapacityError",
    "Launch",
    "Provider",
    "Refused",
    "Seen",
    "build",
]


def build(
    name: str, config: AnyConfig, data_dir: Path, *, tag: str, clock: Callable[[], float]
) -> Provider:
    """The provider for one ``[providers.NAME]`` table."""
    return KINDS[config.kind](name, config, data_dir, tag=tag, clock=clock)
