"""``GpulayerApp``: the control plane as a Jupyter server extension.

It runs inside whatever Jupyter server loads it (``jupyter lab``, a hub's
single-user server). What it runs is :class:`~jupyter_ext.service.GpulayerService`,
which ``python -m jupyter_ext`` (what ``gpulayer up`` starts) hosts without a
Jupyter server (:mod:`jupyter_ext.headless`, ADR 0157). Configuration is
``c.GpulayerApp.*``; routes live under ``<base_url>gpulayer/api/v1/``.
"""

from typing import Any

from jupyter_server.extension.application import ExtensionApp

from gpulayer.contracts import API_PREFIX

from .service import EXTENSION_NAME, GpulayerService, endpoint_of, route_table


class GpulayerApp(GpulayerService, ExtensionApp):
    """The gpulayer control plane, loaded by a Jupyter server."""

    name = EXTENSION_NAME
    description = "gpulayer control plane: schedules notebook work onto GPU workers"
    extension_url = f"{API_PREFIX}/health"
    load_other_extensions = False

    def initialize_settings(self) -> None:
        """Publish the (not yet started) state to handlers."""
        self.prepare_plane(self.settings)

    def initialize_handlers(self) -> None:
        """Mount the route table (the server puts its base URL in front)."""
        self.handlers.extend(route_table())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Open the store, recover state and start the lease sweep."""
        certfile = getattr(serverapp, "certfile", "") or ""
        self.listening(serverapp.port)  # a Jupyter server is bound before this hook runs
        await self.start_plane(
            endpoint_of(serverapp.ip, serverapp.port, serverapp.base_url, certfile)
        )

    def current_activity(self) -> dict[str, Any] | None:
        """Report open long polls so idle culling leaves a busy control plane alone."""
        running = self._state.running
        if running is None:
            return None
        n = running.plane.notifier.waiting()
        channels = running.plane.channels.count()
        busy = {"gpulayer_waiters": n, "gpulayer_channels": channels}
        return {k: v for k, v in busy.items() if v} or None

    async def stop_extension(self) -> None:
        """Cancel background work and close the store."""
        await self.stop_plane()
