"""``kind = "local"``: workers as processes on this machine.

What ``gpulayer up --local-workers N`` starts by hand, on demand: one offer (this
machine, free), instances that are ``gpulayer join`` processes. ``gpus`` sets
``GPULAYER_SIMULATED_GPUS`` for them; without it they discover the real GPUs.
"""

import os

from gpulayer.contracts import Offer
from gpulayer.contracts.providers import LocalConfig, split_gpu_spec

from .base import Launch
from .processes import ProcessProvider


class LocalProvider(ProcessProvider):
    """See the module docstring."""

    kind = "local"
    config: LocalConfig

    def offers(self) -> list[Offer]:
        count, kind, model, memory = split_gpu_spec(self.config.gpus or "")
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        return [
            Offer(
                provider=self.name,
                name="this-machine",
                gpus=count,
                gpu_model=model,
                gpu_memory_bytes=memory,
                accelerator=kind,
                cpus=os.cpu_count() or 1,
                memory_bytes=pages * os.sysconf("SC_PAGE_SIZE") if pages else 0,
                price_per_hour=0.0,
                region="local",
            )
        ]

    def gpu_env(self, launch: Launch) -> str | None:
        return self.config.gpus

    async def create(self, launch: Launch) -> str:
        return await self.start(launch, 0.0, None)
