"""``GET health``: is the control plane up (no token needed)."""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer import __version__
from gpulayer.contracts import Health, WorkerState

from .base import GpulayerAPIHandler


class HealthHandler(GpulayerAPIHandler):
    """``GET health``."""

    @allow_unauthenticated
    async def get(self) -> None:
        """Answer ``Health``."""
        workers = [w for w in await self.gl.workers.all() if w.state == WorkerState.ready]
        active = await self.gl.jobs.active_count()
        self.reply(Health(version=__version__, workers_ready=len(workers), jobs_active=active))


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [(r"health", HealthHandler)]
