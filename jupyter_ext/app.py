"""``GpulayerApp``: the control plane as a Jupyter server extension.

It runs inside whatever Jupyter server loads it (``jupyter lab``, a hub's
single-user server) or headless through ``python -m jupyter_ext`` (what
``gpulayer up`` starts). Configuration is ``c.GpulayerApp.*``; routes live under
``<base_url>gpulayer/api/v1/``.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Int, Unicode, default, validate

from gpulayer.contracts import API_PREFIX

from . import (
    handlers,
    metrics,
    metrics_handlers,
    token_handlers,
    training_handlers,
    worker_handlers,
)
from .artifacts import BlobStore
from .auth import LoginLimiter, TokenService
from .scheduler import Scheduler
from .store import Store
from .streams import Notifier

log = logging.getLogger("gpulayer")

#: Roles the Jupyter server's own user may be given.
JUPYTER_USER_ROLES = ("admin", "submitter", "viewer")


def routes() -> list[tuple[str, type[handlers.GpulayerAPIHandler]]]:
    """Every route the extension mounts (paths relative to the API prefix)."""
    return (
        handlers.ROUTES + worker_handlers.ROUTES + token_handlers.ROUTES + training_handlers.ROUTES
    )


def outer_routes() -> list[tuple[str, type[handlers.GpulayerAPIHandler]]]:
    """Routes beside the API (paths relative to ``<base_url>gpulayer/``)."""
    return metrics_handlers.ROUTES


@dataclass
class Services:
    """What handlers reach through ``self.settings["gpulayer"]``."""

    config: "GpulayerApp"
    store: Store | None = None
    blobs: BlobStore | None = None
    tokens: TokenService | None = None
    notifier: Notifier | None = None
    scheduler: Scheduler | None = None
    metrics_registry: Any = None
    metrics_state: Any = None
    #: Set once the start hook has opened the store; requests that arrive earlier wait.
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class GpulayerApp(ExtensionApp):
    """The gpulayer control plane."""

    name = "gpulayer"
    description = "gpulayer control plane: schedules notebook work onto GPU workers"
    extension_url = f"{API_PREFIX}/health"
    # `python -m jupyter_ext` is a headless control plane; inside `jupyter lab`
    # this attribute is not consulted.
    load_other_extensions = False

    data_dir = Unicode(help="Directory for the database, blobs and the bootstrap tokens.").tag(
        config=True
    )
    db_path = Unicode(help="SQLite database file (default: <data_dir>/gpulayer.db).").tag(
        config=True
    )
    long_poll_seconds = Float(30.0, help="Longest hold of a long poll before 204.").tag(config=True)
    heartbeat_seconds = Float(5.0, help="How often workers heartbeat.").tag(config=True)
    lease_seconds = Float(
        30.0, help="A running task whose worker is silent this long is lost (or retried)."
    ).tag(config=True)
    aging_seconds = Float(
        300.0, help="A job waiting this long keeps later jobs off the workers that could run it."
    ).tag(config=True)
    telemetry_samples = Int(360, help="Heartbeat readings kept per worker (in memory).").tag(
        config=True
    )
    session_idle_seconds = Float(
        3600.0, help="A session with no cell for this long is ended (unless it asks otherwise)."
    ).tag(config=True)
    sweep_seconds = Float(1.0, help="How often leases and heartbeats are checked.").tag(config=True)
    max_body_bytes = Int(8 * 1024 * 1024, help="Largest JSON request body.").tag(config=True)
    max_blob_bytes = Int(512 * 1024 * 1024, help="Largest source bundle or artifact upload.").tag(
        config=True
    )
    max_log_batch_lines = Int(5000, help="Most lines in one log batch.").tag(config=True)
    jupyter_user_role = Unicode(
        "admin",
        help="Role of requests authenticated by the Jupyter server itself"
        " (admin, submitter or viewer).",
    ).tag(config=True)
    login_failures_allowed = Int(
        10,
        help="Failed token logins allowed per client address within"
        " login_failure_window_seconds before answers are 429 (0: no limit).",
    ).tag(config=True)
    login_failure_window_seconds = Float(
        60.0, help="Sliding window of the failed-login limit."
    ).tag(config=True)

    @default("data_dir")
    def _default_data_dir(self) -> str:
        return str(Path(jupyter_data_dir()) / "gpulayer")

    @default("db_path")
    def _default_db_path(self) -> str:
        return str(Path(self.data_dir) / "gpulayer.db")

    @validate("jupyter_user_role")
    def _valid_role(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in JUPYTER_USER_ROLES:
            raise ValueError(f"jupyter_user_role must be one of {JUPYTER_USER_ROLES}")
        return proposal["value"]

    def initialize_settings(self) -> None:
        """Publish the (not yet started) services to handlers."""
        self._services = Services(config=self)
        self._background: list[asyncio.Task[None]] = []
        self.settings["gpulayer"] = self._services

    def initialize_handlers(self) -> None:
        """Mount the route tables under the API prefix."""
        prefix = API_PREFIX.lstrip("/")
        for path, handler in routes():
            self.handlers.append((rf"/{prefix}/{path}/?", handler))
        for path, handler in outer_routes():
            self.handlers.append((rf"/{self.name}/{path}/?", handler))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Open the store, recover state and start the lease sweep."""
        data = Path(self.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        store = await Store(self.db_path).open()
        limiter = LoginLimiter(self.login_failures_allowed, self.login_failure_window_seconds)
        tokens = TokenService(store, limiter=limiter)
        await tokens.bootstrap(data)
        notifier = Notifier()
        blobs = BlobStore(data / "blobs")
        registry, state, instruments = metrics.make_registry(self._services)
        scheduler = Scheduler(
            store,
            blobs,
            notifier,
            tokens,
            heartbeat_seconds=self.heartbeat_seconds,
            aging_seconds=self.aging_seconds,
            telemetry_samples=self.telemetry_samples,
            lease_seconds=self.lease_seconds,
            instruments=instruments,
            session_idle_seconds=self.session_idle_seconds,
        )
        await scheduler.recover()
        s = self._services
        s.metrics_registry, s.metrics_state = registry, state
        s.store, s.blobs, s.tokens, s.notifier, s.scheduler = (
            store,
            blobs,
            tokens,
            notifier,
            scheduler,
        )
        self._background.append(asyncio.create_task(self._sweep_loop(scheduler)))
        await scheduler.schedule()
        s.ready.set()
        self.log.info("gpulayer control plane ready (data in %s)", data)

    async def _sweep_loop(self, scheduler: Scheduler) -> None:
        while True:
            await asyncio.sleep(self.sweep_seconds)
            try:
                await scheduler.sweep()
            except Exception:
                self.log.exception("gpulayer lease sweep failed")

    def current_activity(self) -> dict[str, Any] | None:
        """Report open long polls so idle culling leaves a busy control plane alone."""
        n = self._services.notifier.waiting() if self._services.notifier else 0
        return {"gpulayer_waiters": n} if n else None

    async def stop_extension(self) -> None:
        """Cancel background work and close the store."""
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._background.clear()
        if self._services.store is not None:
            await self._services.store.close()
            self._services.scheduler = None


main = launch_new_instance = GpulayerApp.launch_instance
