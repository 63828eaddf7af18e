"""``GET /gpulayer/metrics``: the Prometheus scrape route (series in ``prometheus.py``).

It lives beside the API (``<base_url>gpulayer/metrics``, not under ``api/v1/``),
where scrapers expect a ``/metrics`` path, and needs a ``viewer`` token (or
``admin``, or the Jupyter user): see ``docs/adr/0020-metrics-route-and-auth.md``.
"""

from jupyter_server.auth.decorator import allow_unauthenticated
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..auth import requires
from .base import GpulayerAPIHandler


class MetricsHandler(GpulayerAPIHandler):
    """``GET /gpulayer/metrics``: Prometheus text format."""

    @allow_unauthenticated
    @requires("viewer")
    async def get(self) -> None:
        """Refresh the state gauges, then expose every series."""
        running = self.running
        await running.gauges.refresh()
        self.finish(generate_latest(running.registry), set_content_type=CONTENT_TYPE_LATEST)


#: Routes outside the API prefix, relative to ``<base_url>gpulayer/``.
ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [(r"metrics", MetricsHandler)]
