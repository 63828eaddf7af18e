"""``GpulayerService``: the control plane whatever server hosts it.

Its configuration (``c.GpulayerApp.*`` traits), its routes, and what it does at
start and stop. Two hosts run it: :class:`~jupyter_ext.app.GpulayerApp`, the Jupyter
server extension (``jupyter lab``, a hub's single-user server), and
:mod:`jupyter_ext.headless`, a plain tornado server (``python -m jupyter_ext``, what
``gpulayer up`` starts; ADR 0157). Routes live under ``<base_url>gpulayer/api/v1/``.
"""

import asyncio
import contextlib
import getpass
import hashlib
import logging
import os
import re
import ssl
import time
import tomllib
from pathlib import Path
from typing import Any, TextIO

from traitlets import Dict, Float, Int, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from gpulayer import paths
from gpulayer.contracts import (
    API_PREFIX,
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    ProviderConfigError,
    parse_providers,
    plain_text,
)
from gpulayer.startup import release_gc

from . import api, data_dir, prometheus
from .api.base import AppState, GpulayerAPIHandler, Limits, Running
from .api.channel import ChannelHandler
from .artifacts import BlobStore
from .auth import LoginLimiter, TokenService
from .control_plane import ControlPlane
from .core import Quotas
from .instances import Endpoint
from .providers import Provider
from .providers import build as build_provider
from .retention import Policy
from .sealing import KEY_FILE
from .store import Store
from .streams import Notifier

log = logging.getLogger("gpulayer")

#: The extension's name (a Jupyter server's, for its settings and outer routes).
EXTENSION_NAME = "gpulayer"
#: The configuration section both hosts read: ``c.GpulayerApp.*``, ``--GpulayerApp.*``.
CONFIG_SECTION = "GpulayerApp"

#: Roles the Jupyter server's own user may be given.
JUPYTER_USER_ROLES = ("admin", "submitter", "viewer")
#: Where the owner of anonymous Jupyter logins is kept, in the data dir.
ANONYMOUS_OWNER_FILE = "jupyter-owner"


def routes() -> list[tuple[str, type[GpulayerAPIHandler]]]:
    """Every route the extension mounts (paths relative to the API prefix)."""
    return api.ROUTES


def channel_routes() -> list[tuple[str, type[ChannelHandler]]]:
    """The live channel's WebSocket routes (paths relative to the API prefix)."""
    return api.CHANNEL_ROUTES


def outer_routes() -> list[tuple[str, type[GpulayerAPIHandler]]]:
    """Routes beside the API (paths relative to ``<base_url>gpulayer/``)."""
    return api.OUTER_ROUTES


def route_table() -> list[tuple[str, type[GpulayerAPIHandler] | type[ChannelHandler]]]:
    """Every route, as the pattern its host mounts under its base URL: the API's and
    the channel's under the API prefix, the others under ``gpulayer/``."""
    prefix = API_PREFIX.strip("/")
    table: list[tuple[str, type[GpulayerAPIHandler] | type[ChannelHandler]]] = []
    table += [(rf"/{prefix}/{path}/?", h) for path, h in routes()]
    table += [(rf"/{prefix}/{path}/?", h) for path, h in channel_routes()]
    table += [(rf"/{EXTENSION_NAME}/{path}/?", h) for path, h in outer_routes()]
    return table


class GpulayerService(LoggingConfigurable):
    """The control plane: its traits, the state it publishes to handlers, its start and
    its stop. A host calls :meth:`prepare_plane` with its web application's settings before
    it serves, :meth:`start_plane` once it listens, and :meth:`stop_plane` when it ends."""

    #: True under ``python -m jupyter_ext``: the server exists for gpulayer only.
    headless = False

    @classmethod
    def section_names(cls) -> list[str]:
        """``GpulayerApp`` whichever class reads it (the extension's name for it)."""
        names = list(super().section_names())
        return names if CONFIG_SECTION in names else [*names, CONFIG_SECTION]

    data_dir = Unicode(
        help="Directory for the database, blobs and the bootstrap tokens (default:"
        " $GPULAYER_DATA_DIR, else <Jupyter data dir>/gpulayer, as for `gpulayer up`)."
    ).tag(config=True)
    db_path = Unicode(help="SQLite database file (default: <data_dir>/gpulayer.db).").tag(
        config=True
    )
    long_poll_seconds = Float(30.0, help="Longest hold of a long poll before 204.").tag(config=True)
    heartbeat_seconds = Float(
        DEFAULT_HEARTBEAT_SECONDS,
        help="How often workers heartbeat; a worker silent for 3 of them is unhealthy.",
    ).tag(config=True)
    lease_seconds = Float(
        DEFAULT_LEASE_SECONDS,
        help="A running task whose worker is silent this long is lost (or retried); workers"
        " stop their tasks when they could not renew it for lease - 2 x heartbeat.",
    ).tag(config=True)
    aging_seconds = Float(
        300.0, help="A job waiting this long keeps later jobs off the workers that could run it."
    ).tag(config=True)
    telemetry_samples = Int(900, help="Heartbeat readings kept per worker (in memory).").tag(
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
    jupyter_anonymous_owner = Unicode(
        "",
        help="Owner of the jobs of Jupyter logins the server knows no name for (its"
        " token or password): one owner for all of them, across connections and"
        " restarts. Default: the name kept in <data_dir>/jupyter-owner, written as"
        " 'jupyter:<OS user>' at the first start. A hub or another identity"
        " provider that names people gives each user its own name instead.",
    ).tag(config=True)
    max_batch_bytes = Int(
        32 * 1024 * 1024, help="Largest log or metric batch body a worker may send."
    ).tag(config=True)
    max_heartbeat_devices = Int(
        64, help="Most GPUs a worker may report in a registration or heartbeat."
    ).tag(config=True)
    max_heartbeat_tasks = Int(
        256, help="Most tasks a worker may report in a registration or heartbeat."
    ).tag(config=True)
    telemetry_window_bytes = Int(
        4 * 1024 * 1024,
        help="Most telemetry kept in memory per worker (the JSON size of its samples).",
    ).tag(config=True)
    max_queued_jobs_per_owner = Int(
        10_000, help="Jobs one owner may have queued at once; more are refused (429)."
    ).tag(config=True)
    max_log_bytes_per_job = Int(
        64 * 1024 * 1024,
        help="Log text stored per job; later lines are dropped and one line says so.",
    ).tag(config=True)
    idempotency_seconds = Float(
        86400.0,
        help="How long a submit's Idempotency-Key is kept: a repeat within this time"
        " answers the jobs the first request created (expired keys are pruned).",
    ).tag(config=True)
    retention_max_age_seconds = Float(
        0.0,
        help="Delete finished jobs (rows, logs, metrics, artifacts) that ended longer ago"
        " than this (0: keep them whatever their age). Active jobs are never deleted.",
    ).tag(config=True)
    retention_max_jobs = Int(
        0, help="Keep at most this many finished jobs, newest first (0: no limit)."
    ).tag(config=True)
    retention_max_bytes = Int(
        0,
        help="While blobs (artifacts, bundles, results) take more bytes than this, delete"
        " the oldest finished jobs (0: no limit).",
    ).tag(config=True)
    blob_grace_seconds = Float(
        3600.0,
        help="A blob no job names is deleted only once it was last stored longer ago than"
        " this (an upload waiting for its submit names no job yet).",
    ).tag(config=True)
    gc_interval_seconds = Float(
        3600.0, help="How often retention and blob garbage collection run (0: only on demand)."
    ).tag(config=True)
    providers = Dict(
        help="Providers that start workers on demand, by name: {'gpu': {'kind': 'slurm',"
        " 'partition': 'gpu', 'max_instances': 4, ...}} (kinds local, slurm, simulated;"
        " docs/providers.md). Tables of providers_file come first.",
    ).tag(config=True)
    providers_file = Unicode(
        "",
        help="A TOML file of [providers.NAME] tables (what `gpulayer up --providers FILE`"
        " passes); '' for none.",
    ).tag(config=True)
    autoscale_seconds = Float(
        1.0, help="How often the autoscaler follows instances and the queue."
    ).tag(config=True)
    channel_ping_seconds = Float(
        15.0,
        help="Keepalive ping period of the live channels (WebSockets) of clients and"
        " workers; a peer that does not answer is dropped (0: no pings).",
    ).tag(config=True)
    channel_max_calls = Int(
        64, help="Calls one live channel may have in flight at once; more are answered 429."
    ).tag(config=True)
    channel_max_unsent_bytes = Int(
        64 * 1024 * 1024,
        help="Answers a live channel's peer has not taken yet, at most; past it the channel"
        " is closed (4408) and the peer resumes from its offsets.",
    ).tag(config=True)
    kernel_detach_seconds = Float(
        120.0,
        help="A gpulayer kernel (docs/kernels.md) with no Jupyter server attached for this"
        " long is ended and its GPUs released (a Jupyter server killed or restarted).",
    ).tag(config=True)
    token_cache_seconds = Float(
        0.5,
        help="How long a resolved token is trusted without reading the store again."
        " Revocations by this control plane apply at once; a change another process"
        " makes to the database is seen at the latest this much later (0: read every time).",
    ).tag(config=True)

    @default("data_dir")
    def _default_data_dir(self) -> str:
        return str(paths.data_dir())  # the one default, shared with `gpulayer up`

    @default("db_path")
    def _default_db_path(self) -> str:
        return str(Path(self.data_dir) / "gpulayer.db")

    @validate("jupyter_user_role")
    def _valid_role(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        if value not in JUPYTER_USER_ROLES:
            raise ValueError(f"jupyter_user_role must be one of {JUPYTER_USER_ROLES}")
        return value

    def prepare_plane(self, settings: dict[str, Any]) -> None:
        """Check the configuration, hold the data dir and publish the (not yet started)
        state to handlers through ``settings`` (the web application's)."""
        limits = Limits(
            long_poll_seconds=self.long_poll_seconds,
            max_body_bytes=self.max_body_bytes,
            max_blob_bytes=self.max_blob_bytes,
            max_log_batch_lines=self.max_log_batch_lines,
            jupyter_user_role=self.jupyter_user_role,
            max_batch_bytes=self.max_batch_bytes,
            max_heartbeat_devices=self.max_heartbeat_devices,
            max_heartbeat_tasks=self.max_heartbeat_tasks,
            channel_ping_seconds=self.channel_ping_seconds,
            channel_max_calls=self.channel_max_calls,
            channel_max_unsent_bytes=self.channel_max_unsent_bytes,
        )
        self._state = AppState(limits=limits, log=self.log)
        self._provider_configs = self._checked_providers()
        self._background: list[asyncio.Task[None]] = []
        settings["gpulayer"] = self._state
        route_service_logs(self.log)
        self._data_lock = self._hold_data_dir()

    def _checked_providers(self) -> dict[str, Any]:
        """The provider tables (file, then trait), checked; a bad one stops the start
        with one line naming the table and the key."""
        tables: dict[str, Any] = {}
        try:
            if self.providers_file:
                with open(self.providers_file, "rb") as f:
                    loaded = tomllib.load(f)
                tables.update(loaded.get("providers", {}) if isinstance(loaded, dict) else {})
            tables.update(self.providers)
            return parse_providers(tables) if tables else {}
        except (OSError, tomllib.TOMLDecodeError, ProviderConfigError) as e:
            where = f"{self.providers_file}: " if self.providers_file else ""
            message = f"gpulayer: providers: {where}{e}"
            self.log.critical(message)
            raise SystemExit(message) from None

    def _build_providers(self, data: Path) -> dict[str, Provider]:
        tag = hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:6]
        return {
            name: build_provider(name, cfg, data, tag=tag, clock=time.time)
            for name, cfg in self._provider_configs.items()
        }

    def _hold_data_dir(self) -> TextIO:
        """Ready the data dir and hold it: one control plane per data dir (`gpulayer up`
        and `jupyter lab` share the default). Raised here, while the extension loads, a
        second one fails at once: Jupyter logs it and runs without gpulayer, and a
        headless one exits."""
        data = Path(self.data_dir)
        for note in paths.prepare_data_dir(data):  # an older gpulayer's folder moves here
            self.log.warning("gpulayer: %s", note)
        try:
            return paths.lock_data_dir(data)
        except paths.DataDirInUse as e:
            if self.headless:  # nothing else to serve: exit, and `gpulayer up` says why
                self.log.critical("gpulayer: %s", e)
                raise SystemExit(f"gpulayer: {e}") from None
            raise

    def listening(self, port: int) -> None:
        """Note, once its server is bound, the port it listens on beside its pid in
        the data dir's lock file (``LocalCluster`` checks that the server answering
        on its port is the one it started)."""
        paths.note_port(self._data_lock, port)

    async def start_plane(self, endpoint: Endpoint) -> None:
        """Open the store, recover state and start the lease sweep (the server listens
        already: requests that arrive meanwhile wait for ``ready``). ``endpoint`` is
        where this control plane's instances reach it."""
        data = Path(self.data_dir)
        # Only its owner may enter the folder: nothing in it is within others' reach.
        # What an older version or a loose umask left readable inside is tightened
        # once the control plane is up (a walk of every blob, ~4 us each).
        data_dir.private_dir(data)
        store = await Store(self.db_path).open()
        limiter = LoginLimiter(self.login_failures_allowed, self.login_failure_window_seconds)
        tokens = TokenService(store, limiter=limiter, cache_seconds=self.token_cache_seconds)
        await tokens.bootstrap(data)
        self._state.anonymous_owner = self.jupyter_anonymous_owner or kept_owner(data)
        registry, instruments = prometheus.make_registry()
        plane = ControlPlane(
            store,
            BlobStore(data / "blobs"),
            Notifier(),
            tokens,
            heartbeat_seconds=self.heartbeat_seconds,
            aging_seconds=self.aging_seconds,
            telemetry_samples=self.telemetry_samples,
            lease_seconds=self.lease_seconds,
            instruments=instruments,
            session_idle_seconds=self.session_idle_seconds,
            quotas=Quotas(
                queued_jobs_per_owner=self.max_queued_jobs_per_owner,
                log_bytes_per_job=self.max_log_bytes_per_job,
                telemetry_bytes_per_worker=self.telemetry_window_bytes,
            ),
            idempotency_seconds=self.idempotency_seconds,
            retention=Policy(
                max_age_seconds=self.retention_max_age_seconds,
                max_jobs=self.retention_max_jobs,
                max_bytes=self.retention_max_bytes,
                blob_grace_seconds=self.blob_grace_seconds,
            ),
            secret_key=data / KEY_FILE,
            providers=self._build_providers(data),
            endpoint=endpoint,
            kernel_detach_seconds=self.kernel_detach_seconds,
        )
        await plane.leases.recover()
        gauges = prometheus.add_state(registry, store, plane.core.fleet, plane.channels)
        self._state.running = Running(plane=plane, registry=registry, gauges=gauges)
        self._background.append(asyncio.create_task(self._sweep_loop(plane)))
        self._background.append(asyncio.create_task(self._secure_data_dir(data)))
        if self.gc_interval_seconds > 0:
            self._background.append(asyncio.create_task(self._gc_loop(plane)))
        if plane.instances.providers:
            self._background.append(asyncio.create_task(self._autoscale_loop(plane)))
        await plane.placer.schedule()
        self._state.ready.set()
        release_gc()  # held by `python -m jupyter_ext` through its start (ADR 0147)
        self.log.info("gpulayer control plane ready (data in %s)", data)

    async def _secure_data_dir(self, data: Path) -> None:
        """Take group and other bits off everything in the data dir (after the start:
        the folder itself is its owner's alone already, docs/security.md)."""
        try:
            tightened = await asyncio.to_thread(data_dir.secure, data)
        except OSError as e:
            self.log.warning("gpulayer: could not tighten the files in %s: %s", data, e)
            return
        if tightened:
            self.log.warning("gpulayer: %d files or folders in %s were readable by others;"
                             " now only their owner may read them", tightened, data)  # fmt: skip

    async def _sweep_loop(self, plane: ControlPlane) -> None:
        while True:
            await asyncio.sleep(self.sweep_seconds)
            try:
                await plane.leases.sweep()
                await plane.kernel_relays.sweep()
            except Exception:
                self.log.exception("gpulayer lease sweep failed")

    async def _autoscale_loop(self, plane: ControlPlane) -> None:
        scaler = plane.autoscaler
        try:
            await scaler.start()  # open intents, the orphan sweep both ways
        except Exception:
            self.log.exception("gpulayer autoscaler start-up failed")
        while True:
            await scaler.wait_for_wake(self.autoscale_seconds)
            try:
                await scaler.tick()
            except Exception:
                self.log.exception("gpulayer autoscaler round failed")

    async def _gc_loop(self, plane: ControlPlane) -> None:
        while True:
            await asyncio.sleep(self.gc_interval_seconds)
            try:
                await plane.retention.collect()
            except Exception:
                self.log.exception("gpulayer garbage collection failed")

    async def stop_plane(self) -> None:
        """Cancel background work and close the store."""
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._background.clear()
        running = self._state.running
        if running is not None:
            for provider in running.plane.instances.providers.values():
                await provider.close()  # instances keep running: a restart adopts them
            running.plane.channels.close_all("the control plane is stopping")
            await running.plane.store.close()
            self._state.running = None
        self._data_lock.close()  # the next control plane on this data dir may start


class _ToServerLog(logging.Handler):
    """Hands the services' records to the Jupyter server's log (its handlers,
    format and level), so they land where the server's own lines do."""

    def __init__(self, target: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        super().__init__()
        self.target = target.logger if isinstance(target, logging.LoggerAdapter) else target

    def emit(self, record: logging.LogRecord) -> None:
        if self.target.isEnabledFor(record.levelno):
            self.target.handle(record)


def _level_shown(target: logging.Logger) -> int:
    """The lowest level a record handed to ``target`` can be shown at: its own level,
    raised to its handlers' where every one of them is stricter. (traitlets leaves the
    server's logger at DEBUG and sets ``--log-level`` on its handler: a debug record
    of ours, one per call, would be built only to be dropped there.)"""
    handlers: list[logging.Handler] = []
    logger: logging.Logger | None = target
    while logger is not None:
        handlers += logger.handlers
        logger = logger.parent if logger.propagate else None
    if not handlers:
        return target.getEffectiveLevel()
    return max(target.getEffectiveLevel(), min(h.level for h in handlers))


def route_service_logs(server_log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Send the ``jupyter_ext.*`` loggers (the services: "worker registered",
    "cancel requested", "task ended") to the server's log, at its level.

    The server configures logging with ``dictConfig``, which disables every logger
    that existed before (ours are created at import), so they are enabled again.
    """
    root = logging.getLogger("jupyter_ext")
    for old in [h for h in root.handlers if isinstance(h, _ToServerLog)]:
        root.removeHandler(old)  # a second app in this process (tests) replaces the first
    handler = _ToServerLog(server_log)
    root.addHandler(handler)
    root.setLevel(_level_shown(handler.target))
    for name, logger in logging.root.manager.loggerDict.items():
        if isinstance(logger, logging.Logger) and name.startswith("jupyter_ext."):
            logger.disabled = False


def kept_owner(data_dir: Path) -> str:
    """The owner of anonymous Jupyter logins kept in ``data_dir`` (written at the
    first start as ``jupyter:<OS user>``; a ``:`` no token name can hold, so no
    token shares its jobs by accident).

    Raises
    ------
    ValueError
        When the file holds something that cannot be an owner's name.
    """
    path = data_dir / ANONYMOUS_OWNER_FILE
    try:
        name = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        name = ""
    if not name:
        try:
            login = getpass.getuser()
        except (OSError, KeyError):  # no passwd entry (some containers)
            login = ""
        name = "jupyter:" + (re.sub(r"[^\w.\-@]", "", login) or "anonymous")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(name + "\n")
    if len(name) > 128:
        raise ValueError(f"{path}: an owner's name has at most 128 characters")
    try:
        return plain_text(name)
    except ValueError as e:
        raise ValueError(f"{path}: the owner's name {e}") from None


def endpoint_of(ip: str, port: int, base_url: str, certfile: str) -> Endpoint:
    """Where this control plane's instances reach it (a provider's ``url`` wins): the
    address its server listens on, loopback for all addresses."""
    scheme = "https" if certfile else "http"
    ip = ip if ip not in ("", "0.0.0.0", "localhost") else "127.0.0.1"
    host = f"[{ip}]" if ":" in ip else ip
    url = f"{scheme}://{host}:{port}{base_url}"
    return Endpoint(url, certificate_fingerprint(certfile) if certfile else None)


def certificate_fingerprint(certfile: str) -> str | None:
    """``sha256:<hex>`` of a PEM certificate's DER bytes (what workers pin), or None."""
    try:
        pem = Path(certfile).read_text()
        return "sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()
    except (OSError, ValueError):
        return None
