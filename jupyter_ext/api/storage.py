"""``gc``: garbage collection on demand (retention also runs on its own, see
``retention.py``)."""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import GcRequest

from ..auth import requires
from .base import GpulayerAPIHandler


class GcHandler(GpulayerAPIHandler):
    """``POST gc`` (admin): apply the retention policy now."""

    @allow_unauthenticated
    @requires("admin")
    async def post(self) -> None:
        """Collect with the configured limits, or those the ``GcRequest`` gives; answers
        a ``GcReport``."""
        req = self.parse(GcRequest) if self.body else GcRequest()
        self.reply(await self.gl.retention.collect(req))


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"gc", GcHandler),
]
