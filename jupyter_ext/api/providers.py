"""``providers`` and ``instances`` routes: what capacity providers offer and run."""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import InstanceList, Provider, ProviderList

from ..auth import requires
from .base import GpulayerAPIHandler


class ProvidersHandler(GpulayerAPIHandler):
    """``GET providers``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """Every configured provider with its offers, limits and active instances."""
        plane = self.gl
        active = await plane.instances.all()
        out = []
        for provider, offers in plane.autoscaler.offers():
            cfg = provider.config
            out.append(
                Provider(
                    name=provider.name,
                    kind=provider.kind,
                    min_instances=cfg.min_instances,
                    max_instances=cfg.max_instances,
                    idle_timeout_seconds=cfg.idle_timeout or 0.0,
                    boot_timeout_seconds=cfg.boot_timeout or 0.0,
                    active_instances=sum(
                        1 for i in active if i.provider == provider.name and i.state.active
                    ),
                    offers=offers,
                    backoff=plane.autoscaler.backoff_left(provider.name),
                )
            )
        self.reply(ProviderList(providers=out))


class InstancesHandler(GpulayerAPIHandler):
    """``GET instances``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """Active instances, then recent ended ones, with state, age and cost."""
        self.reply(InstanceList(instances=await self.gl.instances.all()))


class InstanceTerminateHandler(GpulayerAPIHandler):
    """``POST instances/{id}/terminate``."""

    @allow_unauthenticated
    @requires("admin")
    async def post(self, instance_id: str) -> None:
        """Terminate an instance now (its running tasks end lost and are retried)."""
        self.reply(await self.gl.instances.stop_by_admin(instance_id, self.who.name))


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"providers", ProvidersHandler),
    (r"instances", InstancesHandler),
    (r"instances/(?P<instance_id>[^/]+)/terminate", InstanceTerminateHandler),
]
