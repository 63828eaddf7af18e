"""User-facing ``workers`` routes: the fleet, draining, forgetting, telemetry."""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import WorkerList

from ..auth import requires
from .base import GpulayerAPIHandler


class WorkersHandler(GpulayerAPIHandler):
    """``GET workers``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """Every worker with its state and running tasks (a submitter's own only)."""
        self.reply(WorkerList(workers=await self.gl.workers.all(self.who)))


class WorkerDrainHandler(GpulayerAPIHandler):
    """``POST workers/{name}/drain`` and ``workers/{name}/resume``."""

    @allow_unauthenticated
    @requires("admin")
    async def post(self, name: str, action: str) -> None:
        """Drain (finish running tasks, take no new ones) or resume a worker."""
        self.reply(await self.gl.workers.drain(name, draining=action == "drain"))


class WorkerHandler(GpulayerAPIHandler):
    """``DELETE workers/{name}``: forget a worker (its name may join again)."""

    @allow_unauthenticated
    @requires("admin")
    async def delete(self, name: str) -> None:
        """Revoke its tokens, end its tasks as lost, remove it; 204."""
        await self.gl.workers.forget(name)
        self.no_content()


class WorkerTelemetryHandler(GpulayerAPIHandler):
    """``GET workers/{name}/telemetry``: the recent heartbeat readings."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, name: str) -> None:
        """Answer ``Telemetry`` (a submitter sees the readings of its own tasks only)."""
        self.reply(await self.gl.workers.telemetry(name, self.who))


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"workers", WorkersHandler),
    (r"workers/(?!register$)(?P<name>[^/]+)/(?P<action>drain|resume)", WorkerDrainHandler),
    (r"workers/(?P<name>[^/]+)/telemetry", WorkerTelemetryHandler),
    (r"workers/(?!register$)(?P<name>[^/]+)", WorkerHandler),
]
