"""The control plane's services, wired over one core.

:class:`ControlPlane` builds the :class:`~jupyter_ext.core.Core` and hands each
service its collaborators through its constructor (nothing here has logic of its
own)::

    Core ◀── Sessions ◀── Placer ◀── Jobs, Tasks, Workers ◀── Leases
                    ▲  ▲               ▲  (Jobs, Tasks, Workers also take Secrets)
                    │  └─ Secrets      │
                    └─ SessionService ─┘   TrainingMetrics (Jobs, Tasks)
                                           KernelRelays (Sessions, Jobs)
                                           Retention (Core: deletes, garbage collection)
                                           Instances (Workers, providers) ◀── Autoscaler

``app.py`` builds one per server; tests and ``benchmarks/scheduler.py`` build
their own on a temporary store with an injected clock.
"""

import time
from collections.abc import Callable
from pathlib import Path

from gpulayer.contracts import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_LEASE_SECONDS

from .artifacts import BlobStore
from .auth import TokenService
from .autoscaler import Autoscaler
from .channels import Channels
from .core import Core, Quotas, Settings
from .instances import Endpoint, Instances
from .jobs import Jobs
from .kernel_relays import KernelRelays
from .leases import Leases
from .placer import Placer
from .prometheus import Instruments
from .providers import Provider
from .retention import Policy, Retention
from .sealing import KEY_FILE, Sealer
from .secrets import Secrets
from .sessions import Sessions, SessionService
from .store import Store
from .streams import Notifier
from .tasks import Tasks
from .training_metrics import TrainingMetrics
from .workers import Workers


class ControlPlane:
    """Every service of one control plane (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        notifier: Notifier,
        tokens: TokenService,
        *,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        aging_seconds: float = 300.0,
        telemetry_samples: int = 900,
        session_idle_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
        instruments: Instruments | None = None,
        quotas: Quotas | None = None,
        idempotency_seconds: float = 86400.0,
        retention: Policy | None = None,
        secret_key: Path | None = None,
        providers: dict[str, Provider] | None = None,
        endpoint: Endpoint | None = None,
        kernel_detach_seconds: float = 120.0,
    ) -> None:
        settings = Settings(
            heartbeat_seconds,
            lease_seconds,
            aging_seconds,
            session_idle_seconds,
            idempotency_seconds=idempotency_seconds,
        )
        self.core = core = Core(
            store,
            blobs,
            notifier,
            settings=settings,
            telemetry_samples=telemetry_samples,
            clock=clock,
            instruments=instruments,
            quotas=quotas or Quotas(),
        )
        self.store, self.blobs, self.notifier, self.tokens = store, blobs, notifier, tokens
        self.sessions = Sessions(core)
        self.placer = Placer(core, self.sessions)
        # The key lives in the data dir (next to the database unless told otherwise).
        sealer = Sealer(secret_key or Path(store.path).parent / KEY_FILE)
        self.secrets = Secrets(core, self.sessions, sealer)
        self.jobs = Jobs(core, self.sessions, self.placer, self.secrets)
        self.session_service = SessionService(core, self.sessions, self.jobs)
        self.tasks = Tasks(core, self.sessions, self.placer, self.secrets)
        self.workers = Workers(core, self.placer, tokens, self.secrets)
        self.jobs.start_at_submit = self.workers.start_at_submit
        self.leases = Leases(core, self.sessions, self.placer, self.jobs, self.workers)
        self.training_metrics = TrainingMetrics(core, self.jobs, self.tasks)
        self.retention = Retention(core, retention)
        self.instances = Instances(
            core, tokens, self.workers, providers or {}, endpoint or Endpoint("http://127.0.0.1/")
        )
        self.autoscaler = Autoscaler(core, self.instances, core.board)
        if providers:
            self.placer.on_queued = self.autoscaler.wake
        self.channels = Channels()  # the open live channels (WebSockets), by token
        self.kernel_relays = KernelRelays(
            core, self.sessions, self.jobs, detach_seconds=kernel_detach_seconds
        )

    async def start(self) -> None:
        """Recover after a (re)start, then place what waits."""
        await self.leases.recover()
        await self.placer.schedule()
