"""``kind = "simulated"``: a cloud's shape on this machine, for tests and demos.

Offers with prices, capacity errors (the first N creates of an offer fail), slow
boots, instances that vanish, billing by the second; each instance is real
``gpulayer join`` processes with ``GPULAYER_SIMULATED_GPUS`` set to the offer's
GPUs, so placement sees them as a cloud machine's.
"""

import asyncio
from collections import Counter
from typing import Any

from gpulayer.contracts import Offer
from gpulayer.contracts.providers import GIB, SimulatedConfig, SimulatedOffer, split_gpu_spec

from .base import CapacityError, Launch
from .processes import ProcessProvider


class SimulatedProvider(ProcessProvider):
    """See the module docstring."""

    kind = "simulated"
    config: SimulatedConfig

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: Creates asked per offer (capacity errors fail the first N).
        self.tried: Counter[str] = Counter()

    def _offer(self, name: str) -> SimulatedOffer:
        return next(o for o in self.config.offers if o.name == name)

    def offers(self) -> list[Offer]:
        out = []
        for o in self.config.offers:
            count, kind, model, memory = split_gpu_spec(o.gpus)
            out.append(
                Offer(
                    provider=self.name,
                    name=o.name,
                    gpus=count,
                    gpu_model=model,
                    gpu_memory_bytes=memory,
                    accelerator=kind,
                    cpus=o.cpus,
                    memory_bytes=int(o.memory * GIB),
                    price_per_hour=o.price_per_hour,
                    region=o.region,
                    max_nodes=o.max_nodes,
                )
            )
        return out

    def gpu_env(self, launch: Launch) -> str | None:
        return self._offer(launch.offer.name).gpus

    async def create(self, launch: Launch) -> str:
        o = self._offer(launch.offer.name)
        self.tried[o.name] += 1
        if o.capacity_errors < 0 or self.tried[o.name] <= o.capacity_errors:
            raise CapacityError(
                f"{self.name}: no capacity for {o.name} in {o.region} (simulated"
                f" InsufficientInstanceCapacity)"
            )
        external = await self.start(launch, o.boot_seconds, o.vanish_after)
        if o.create_seconds:  # a slow API: the instance exists before the answer comes
            await asyncio.sleep(o.create_seconds)
        return external
