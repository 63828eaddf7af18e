"""The autoscaler: capacity follows the queue (docs/providers.md, ADR 0117).

One :meth:`Autoscaler.tick` (every ``autoscale_seconds``, and at once after a
placement pass that left jobs queued) does, in order:

1. **follow** the instances (``Instances.refresh``): pending → booting → ready,
   joins recorded, instances the provider lost marked ``lost`` (their tasks are
   retried);
2. **boot timeout**: an instance whose worker has not joined within its provider's
   ``boot_timeout`` is terminated (``failed``); its jobs are provisioned again;
3. **idle timeout**: an instance whose workers ran no task for ``idle_timeout`` is
   terminated, unless that leaves its provider below ``min_instances``. A worker
   with an active task is never terminated: its workers are drained under the
   core's lock (no placement can race), checked once more, and resumed if busy;
4. **drain** workers whose allocation ends within ``drain_before_end`` (Slurm);
5. **demand**: a queued job that no registered worker could ever run (the same
   ``placement.static_misfit`` rule that makes a job unsatisfiable; a draining
   worker, or one whose allocation ends before the job's timeout, does not count)
   and that no
   instance is being provisioned for gets the cheapest fitting offer of the
   providers below ``max_instances``. A capacity error backs that offer off
   (2 s doubling to 5 min) and the next offer is tried at once; a refusal (Slurm:
   "Requested node configuration is not available") is remembered as the job's
   reason, and the job is unsatisfiable when every fitting offer refused it; such
   a job is not offered again for ``BACKOFF_MAX_SECONDS`` (a refusal is the
   provider's word on the request, not a passing shortage: asked at every tick,
   Slurm got an ``sbatch`` and the store a failed instance twice a second). A
   gang gets one instance with all its nodes, or nothing;
6. **minimum**: providers below ``min_instances`` get instances of their cheapest
   offer.

It publishes what it knows on the :class:`~jupyter_ext.provisioning.Board`.
"""

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass

from gpulayer.contracts import InstanceState, JobSpec, JobState, Offer, Provisioning, WorkerState

from . import gangs
from .core import Core
from .instances import Instances
from .placement import static_misfit
from .providers import CapacityError, Provider, Refused
from .providers.base import AnyConfig
from .provisioning import Board, offer_fits
from .store import InstanceRecord, JobRecord

log = logging.getLogger(__name__)

_S = InstanceState
#: Queued jobs of each placement shape the autoscaler reads for its demand.
_PER_SHAPE = 64
BACKOFF_FIRST_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 300.0


@dataclass
class _Backoff:
    until: float
    delay: float


class Autoscaler:
    """See the module docstring."""

    def __init__(self, core: Core, instances: Instances, board: Board) -> None:
        self._core = core
        self._instances = instances
        self.board = board
        self._lock = asyncio.Lock()
        self.backoff: dict[tuple[str, str], _Backoff] = {}
        # job id -> when every fitting offer last refused it (asked again after
        # BACKOFF_MAX_SECONDS; entries older than twice that are dropped).
        self._refused_at: dict[str, float] = {}
        self._wake = asyncio.Event()
        board.offers = [
            (o, dict(p.config.labels)) for p in self.providers.values() for o in p.offers()
        ]

    @property
    def providers(self) -> dict[str, Provider]:
        """The configured providers by name."""
        return self._instances.providers

    def wake(self) -> None:
        """Ask for a tick soon (a placement pass left jobs queued)."""
        self._wake.set()

    async def wait_for_wake(self, timeout: float) -> None:
        """Sleep until :meth:`wake` or ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    async def start(self) -> None:
        """At start: finish open intents, sweep orphans both ways, then tick."""
        await self._instances.recover()
        await self._instances.sweep()
        await self.tick()

    async def tick(self) -> None:
        """One round (see the module docstring)."""
        async with self._lock:
            await self._instances.refresh()
            await self._retry_terminations()
            now = self._core.clock()
            active = await self._core.store.active_instances()
            await self._boot_timeouts(active, now)
            await self._idle(now)
            await self._drain_ending(now)
            await self._demand(now)
            await self._minimum()
            await self._publish()

    # ------------------------------------------------------------ the rules

    async def _retry_terminations(self) -> None:
        for rec in await self._core.store.active_instances():
            if rec.state == _S.terminating:
                await self._instances.terminate(rec, rec.reason or "terminated")

    async def _boot_timeouts(self, active: list[InstanceRecord], now: float) -> None:
        for rec in active:
            cfg = self._config(rec)
            if cfg is None or rec.state not in (_S.provisioning, _S.booting):
                continue
            if rec.external_id is not None and now - rec.created_at > (cfg.boot_timeout or 600):
                why = f"its worker did not join within {cfg.boot_timeout:g}s (boot_timeout)"
                await self._instances.terminate(rec, why, _S.failed)

    async def _idle(self, now: float) -> None:
        core = self._core
        count = Counter(r.provider for r in await core.store.active_instances())
        for rec in await core.store.active_instances():
            cfg = self._config(rec)
            if cfg is None or rec.state not in (_S.ready, _S.idle):
                continue
            busy = await self._busy(rec)
            if busy:
                if rec.state == _S.idle:
                    await core.store.update_instance(rec.id, state=_S.ready.value, idle_since=None)
                continue
            if rec.idle_since is None:
                await core.store.update_instance(rec.id, state=_S.idle.value, idle_since=now)
                continue
            idle_for = now - rec.idle_since
            if idle_for < (cfg.idle_timeout or 600) or count[rec.provider] <= cfg.min_instances:
                continue
            if await self._drain_if_idle(rec):
                count[rec.provider] -= 1
                why = f"idle for {idle_for:.0f}s (idle_timeout {cfg.idle_timeout:g}s)"
                await self._instances.terminate(rec, why)

    async def _busy(self, rec: InstanceRecord) -> bool:
        store = self._core.store
        for name in rec.workers:
            w = await store.worker_by_name(name)
            if w is not None and await store.active_tasks(w.id):
                return True
        return False

    async def _drain_if_idle(self, rec: InstanceRecord) -> bool:
        """Drain the instance's workers unless one has an active task, atomically
        with respect to placement; True when they are drained and idle."""
        core = self._core
        async with core.lock:
            if await self._busy(rec):
                return False
            for name in rec.workers:
                w = await core.store.worker_by_name(name)
                if w is not None:
                    await core.store.set_draining(w.id, True)
        return True

    async def _drain_ending(self, now: float) -> None:
        core = self._core
        for rec in await core.store.active_instances():
            cfg = self._config(rec)
            before = getattr(cfg, "drain_before_end", None)
            if rec.ends_at is None or before is None or rec.ends_at - now > before:
                continue
            for name in rec.workers:
                w = await core.store.worker_by_name(name)
                if w is not None and not w.draining:
                    log.info("draining %s: its allocation ends in %.0fs", name, rec.ends_at - now)
                    await core.store.set_draining(w.id, True)

    async def _demand(self, now: float) -> None:
        core = self._core
        if not self.providers or not len(core.queue):
            return
        active = await core.store.active_instances()
        in_flight = [r for r in active if r.state in (_S.provisioning, _S.booting)]
        claimed = {j for r in in_flight for j in r.job_ids}
        views = [w for w in await core.fleet.views() if w.state != WorkerState.offline]
        counts = Counter(r.provider for r in active)
        # The oldest jobs of each shape speak for it (queue.py): never the whole queue.
        rows = await core.store.jobs_by_ids(core.queue.sample(_PER_SHAPE))
        queued = sorted(
            (j for j in rows if j.state == JobState.queued), key=lambda j: (-j.priority, j.seq)
        )
        specs = {j.id: core.spec(j) for j in queued}
        self._refused_at = {
            j: t for j, t in self._refused_at.items() if now - t < 2 * BACKOFF_MAX_SECONDS
        }
        for job in queued:
            spec = specs[job.id]
            if spec.in_session or job.id in claimed:
                continue
            refused = self._refused_at.get(job.id)
            if refused is not None and now - refused < BACKOFF_MAX_SECONDS:
                continue  # every fitting offer refused it just now
            # a draining worker (its allocation near its end, or drained by hand) and
            # one whose allocation ends before the job's timeout take no new work
            fitting = [
                w for w in views
                if w.state != WorkerState.draining and static_misfit(spec.resources, w) is None
                and self.board.time_left_fits(w.name, spec, now)
            ]  # fmt: skip
            if len(fitting) >= (spec.nodes if gangs.is_gang(spec) else 1):
                continue  # a registered worker could run it: it waits for that one
            if not gangs.is_gang(spec) and await self._share(job.id, spec, in_flight, specs):
                continue
            await self._provision(job, spec, counts, now)

    async def _share(
        self, job_id: str, spec: JobSpec, in_flight: list[InstanceRecord], specs: dict[str, JobSpec]
    ) -> bool:
        """Claim room (a slot and GPUs) on an instance already being provisioned for
        other jobs, rather than asking for another."""
        for i, rec in enumerate(in_flight):
            provider = self.providers.get(rec.provider)
            if provider is None or rec.nodes != 1 or len(rec.job_ids) >= rec.slots:
                continue
            offer = next((o for o in provider.offers() if o.name == rec.offer), None)
            if offer is None or offer.sized_to_job:
                continue
            if not offer_fits(offer, dict(provider.config.labels), spec):
                continue
            used = sum(specs[j].resources.gpus for j in rec.job_ids if j in specs)
            if rec.gpus - used < spec.resources.gpus:
                continue
            self.board.announce(rec.id, rec.provider, rec.detail or rec.state.value, [job_id])
            await self._core.store.update_instance(rec.id, job_ids=[*rec.job_ids, job_id])
            in_flight[i] = await self._instances.get(rec.id)
            return True
        return False

    async def _provision(
        self, job: JobRecord, spec: JobSpec, counts: Counter[str], now: float
    ) -> None:
        candidates = sorted(
            (
                (o, p)
                for p in self.providers.values()
                for o in p.offers()
                if offer_fits(o, dict(p.config.labels), spec)
            ),
            key=lambda op: (op[0].price_per_hour, op[1].name, op[0].name),
        )
        refusals: list[str] = []
        for offer, provider in candidates:
            if counts[provider.name] >= provider.config.max_instances:
                continue
            held = self.backoff.get((provider.name, offer.name))
            if held is not None and now < held.until:
                continue
            res = spec.resources
            try:
                await self._instances.create(
                    provider, offer, job_ids=[job.id],
                    nodes=spec.nodes if gangs.is_gang(spec) else 1,
                    gpus=res.gpus if offer.sized_to_job else None,
                    cpus=max(1, int(-(-res.cpus // 1))) if offer.sized_to_job else None,
                    memory_bytes=int(res.memory or 0) if offer.sized_to_job else 0,
                    seconds=spec.timeout if offer.sized_to_job else None,
                    announce=self.board.announce,
                )  # fmt: skip
            except CapacityError as e:
                delay = min(BACKOFF_MAX_SECONDS, held.delay * 2 if held else BACKOFF_FIRST_SECONDS)
                self.backoff[(provider.name, offer.name)] = _Backoff(now + delay, delay)
                log.info("%s; %s backs off for %gs, trying the next offer", e, offer.name, delay)
                continue
            except Refused as e:
                refusals.append(str(e))
                continue
            self.backoff.pop((provider.name, offer.name), None)
            self.board.refusals.pop(job.id, None)
            counts[provider.name] += 1
            return
        if refusals:
            self.board.refusals[job.id] = "; ".join(refusals)
            self._refused_at[job.id] = now

    async def _minimum(self) -> None:
        core = self._core
        counts = Counter(r.provider for r in await core.store.active_instances())
        now = core.clock()
        for provider in self.providers.values():
            offers = sorted(provider.offers(), key=lambda o: o.price_per_hour)
            while counts[provider.name] < provider.config.min_instances and offers:
                offer = offers[0]
                held = self.backoff.get((provider.name, offer.name))
                if held is not None and now < held.until:
                    break
                try:
                    await self._instances.create(provider, offer)
                except (CapacityError, Refused) as e:
                    delay = min(BACKOFF_MAX_SECONDS, held.delay * 2 if held else 2.0)
                    self.backoff[(provider.name, offer.name)] = _Backoff(now + delay, delay)
                    log.info("min_instances of %s: %s", provider.name, e)
                    break
                counts[provider.name] += 1

    async def _publish(self) -> None:
        """The board: notes of queued jobs waiting for an instance, allocation ends."""
        notes: dict[str, Provisioning] = {}
        ends: dict[str, float] = {}
        for rec in await self._core.store.active_instances():
            if rec.state in (_S.provisioning, _S.booting):
                detail = rec.detail or rec.state.value
                if rec.state == _S.booting and "running" in detail:
                    detail = f"{detail}; waiting for its worker to join"
                for job_id in rec.job_ids:
                    notes[job_id] = Provisioning(
                        instance_id=rec.id, provider=rec.provider, state=rec.state, detail=detail
                    )
            if rec.ends_at is not None:
                ends.update(dict.fromkeys(rec.workers, rec.ends_at))
        self.board.notes = notes
        self.board.ends_at = ends

    def _config(self, rec: InstanceRecord) -> AnyConfig | None:
        provider = self.providers.get(rec.provider)
        return None if provider is None else provider.config

    def backoff_left(self, provider: str) -> dict[str, float]:
        """Seconds until each backed-off offer of ``provider`` is tried again."""
        now = self._core.clock()
        return {
            offer: round(b.until - now, 1)
            for (name, offer), b in self.backoff.items()
            if name == provider and b.until > now
        }

    def offers(self) -> list[tuple[Provider, list[Offer]]]:
        """Each provider with its offers."""
        return [(p, p.offers()) for p in self.providers.values()]
