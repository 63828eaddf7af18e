"""Instances: every provider call recorded as an intent before and an outcome after.

:class:`Instances` is the only caller of providers. ``create`` and ``terminate``
write an intent (and the instance's new row) to the store, call the provider
*outside* any store transaction and without the core's lock (a provider call can
take seconds: an ``sbatch``, a cloud API), then write the outcome. A control plane
that stops between the two finds the intent open at the next start;
:meth:`Instances.recover` asks the provider what happened (our instances carry
their gpulayer id) and finishes the record either way. :meth:`Instances.sweep`
then terminates provider instances the store does not know (orphans) and marks
store instances the provider no longer has ``lost``.

:meth:`Instances.refresh` follows each active instance: ``provisioning`` (asked,
pending at the provider) → ``booting`` (running there) → ``ready`` (its worker
joined; ``idle`` while it has no task) → ``terminating`` → ``gone``; an instance
the provider stopped reporting is ``lost`` and its workers are forgotten, so their
running tasks end ``lost`` and are retried.
"""

import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulayer.contracts import Instance, InstanceState, Offer
from gpulayer.errors import NotFound

from .auth import TokenService
from .core import Core
from .providers import CapacityError, Launch, Provider, Refused, Seen
from .store import InstanceRecord
from .workers import Workers

log = logging.getLogger(__name__)

_S = InstanceState


@dataclass(frozen=True)
class Endpoint:
    """How instances reach this control plane."""

    url: str
    fingerprint: str | None = None


class Instances:
    """See the module docstring."""

    def __init__(
        self,
        core: Core,
        tokens: TokenService,
        workers: Workers,
        providers: dict[str, Provider],
        endpoint: Endpoint,
    ) -> None:
        self._core = core
        self._tokens = tokens
        self._workers = workers
        self.providers = providers
        self.endpoint = endpoint
        self.seen: dict[str, Seen] = {}  # instance id -> the provider's latest word

    # ------------------------------------------------------------ creating

    async def create(
        self,
        provider: Provider,
        offer: Offer,
        *,
        job_ids: Sequence[str] = (),
        nodes: int = 1,
        gpus: int | None = None,
        cpus: int | None = None,
        memory_bytes: int = 0,
        seconds: float | None = None,
        announce: Callable[[str, str, str, Sequence[str]], None] | None = None,
    ) -> InstanceRecord:
        """Ask ``provider`` for an instance of ``offer`` (for ``job_ids``);
        ``announce(instance id, provider, detail, job ids)`` is told before anything
        is written (the board's note for the jobs).

        Raises
        ------
        CapacityError, Refused
            As the provider raised them; the instance is recorded ``failed``.
        """
        core = self._core
        now = core.clock()
        instance_id = uuid.uuid4().hex[:8]
        prefix = f"{provider.name}-{instance_id}"
        names = (prefix,) if nodes == 1 else tuple(f"{prefix}-{i}" for i in range(nodes))
        gpus = offer.gpus if gpus is None else gpus
        cfg = provider.config
        rec = InstanceRecord(
            id=instance_id, provider=provider.name, offer=offer.name, state=_S.provisioning,
            external_id=None, workers=names, nodes=nodes, gpus=gpus * nodes, slots=cfg.slots,
            job_ids=tuple(job_ids), price_per_hour=offer.price_per_hour * nodes,
            reason="for jobs " + ", ".join(j[:6] for j in job_ids) if job_ids else "min_instances",
            detail=f"asked {provider.name} for {offer.name}", created_at=now, booted_at=None,
            ready_at=None, idle_since=None, ends_at=None, ended_at=None,
        )  # fmt: skip
        if announce is not None:
            announce(instance_id, provider.name, rec.detail or "", rec.job_ids)
        seq = await core.store.create_intent(rec)
        expires = now + (cfg.boot_timeout or 600.0) + 60.0
        tokens = tuple([await self._tokens.for_instance(instance_id, n, expires) for n in names])
        launch = Launch(
            instance_id=instance_id, offer=offer, workers=names, tokens=tokens,
            url=cfg.url or self.endpoint.url,
            fingerprint=None if cfg.url else self.endpoint.fingerprint, gpus=gpus,
            cpus=cpus or offer.cpus, memory_bytes=memory_bytes, slots=cfg.slots,
            labels={**cfg.labels, "provider": provider.name, "instance": instance_id},
            seconds=seconds,
        )  # fmt: skip
        try:
            external = await provider.create(launch)
        except (CapacityError, Refused) as e:
            await self._failed(seq, rec, str(e))
            raise
        except Exception as e:  # a provider that broke: like no capacity, with backoff
            log.exception("provider %s failed to create an instance", provider.name)
            await self._failed(seq, rec, f"{provider.name}: {e}")
            raise CapacityError(f"{provider.name}: {e}") from e
        await core.store.outcome(
            seq, f"created {external}", core.clock(), instance_id, external_id=external,
            detail=f"created {external} at {provider.name}",
        )  # fmt: skip
        log.info("instance %s (%s) created at %s for %s", instance_id, external, provider.name,
                 list(job_ids))  # fmt: skip
        return await self.get(instance_id)

    async def _failed(self, seq: int, rec: InstanceRecord, why: str) -> None:
        now = self._core.clock()
        await self._core.store.outcome(
            seq, f"failed: {why}", now, rec.id, state=_S.failed.value, reason=why, ended_at=now
        )
        await self._tokens.revoke_instance(rec.id)

    # --------------------------------------------------------- terminating

    async def terminate(
        self, rec: InstanceRecord, reason: str, end_state: InstanceState = _S.gone
    ) -> None:
        """Terminate an instance at its provider, forget its workers; it ends
        ``end_state`` (``gone``; ``failed`` when it never joined)."""
        core = self._core
        provider = self.providers.get(rec.provider)
        seq = await core.store.intent(
            rec.id, rec.provider, "terminate", core.clock(), state=_S.terminating.value,
            reason=reason,
        )  # fmt: skip
        if provider is not None and rec.external_id is not None:
            try:
                await provider.terminate(rec.external_id)
            except Exception as e:  # the intent stays open: retried at the next start
                log.warning("terminating instance %s failed: %s", rec.id, e)
                return
        await self._end(rec, seq, "terminated", end_state, reason)

    async def _end(
        self, rec: InstanceRecord, seq: int | None, outcome: str, state: InstanceState, why: str
    ) -> None:
        core = self._core
        now = core.clock()
        if seq is None:
            await core.store.update_instance(rec.id, state=state.value, reason=why, ended_at=now)
        else:
            await core.store.outcome(
                seq, outcome, now, rec.id, state=state.value, reason=why, ended_at=now
            )
        await self._tokens.revoke_instance(rec.id)
        for name in rec.workers:
            with contextlib.suppress(NotFound):  # its running tasks end lost (and retry)
                await self._workers.forget(name)
        self.seen.pop(rec.id, None)
        log.info("instance %s %s: %s", rec.id, state.value, why)

    # ------------------------------------------------------------ following

    async def refresh(self) -> None:
        """Ask every provider about our instances; move each active one on."""
        core = self._core
        active = await core.store.active_instances()
        by_provider: dict[str, list[Seen]] = {}
        for name, provider in self.providers.items():
            if not any(r.provider == name for r in active):
                continue
            try:
                by_provider[name] = await provider.list()
            except Exception as e:
                log.warning("provider %s did not answer: %s", name, e)
        for rec in active:
            if rec.provider not in by_provider or rec.state == _S.terminating:
                continue
            found = {s.instance_id: s for s in by_provider[rec.provider]}.get(rec.id)
            await self._follow(rec, found)

    async def _follow(self, rec: InstanceRecord, seen: Seen | None) -> None:
        core = self._core
        now = core.clock()
        if rec.external_id is None:
            return  # its create is in flight (or was interrupted: recover decides)
        if seen is None or seen.state == "ended":
            why = seen.detail if seen is not None else f"{rec.provider} no longer has it"
            await self._end(rec, None, "", _S.lost, why)
            return
        self.seen[rec.id] = seen
        fields: dict[str, object] = {}
        if seen.detail and seen.detail != rec.detail and rec.state in (_S.provisioning, _S.booting):
            fields["detail"] = seen.detail
        if seen.ends_at is not None and seen.ends_at != rec.ends_at:
            fields["ends_at"] = seen.ends_at
        if rec.state == _S.provisioning and seen.state == "running":
            fields |= {"state": _S.booting.value, "booted_at": now}
        if rec.state in (_S.provisioning, _S.booting):
            joined = await self._joined(rec, now)
            if joined:
                fields |= {"state": _S.ready.value, "ready_at": now, "detail": seen.detail}
        if fields:
            await core.store.update_instance(rec.id, **fields)

    async def _joined(self, rec: InstanceRecord, now: float) -> bool:
        """Record the instance's workers that registered; True once all have."""
        store = self._core.store
        found = 0
        for name in rec.workers:
            w = await store.worker_by_name(name)
            if w is not None:
                await store.joined(w.id, rec.id, name, now)
                found += 1
        return found == len(rec.workers)

    # ------------------------------------------------------------- restart

    async def recover(self) -> None:
        """Finish the intents a stopped control plane left open (see the module docstring)."""
        core = self._core
        for intent in await core.store.open_intents():
            rec = await core.store.get_instance(intent.instance_id)
            provider = self.providers.get(intent.provider)
            if rec is None:
                await core.store.outcome(intent.seq, "instance unknown", core.clock(), "")
                continue
            seen: Seen | None = None
            if provider is not None:
                try:
                    seen = {s.instance_id: s for s in await provider.list()}.get(rec.id)
                except Exception as e:
                    log.warning("recovering instance %s: %s did not answer: %s", rec.id,
                                intent.provider, e)  # fmt: skip
                    continue
            if intent.action == "create":
                if seen is not None and seen.state != "ended":
                    await core.store.outcome(
                        intent.seq, f"adopted {seen.external_id} after a restart", core.clock(),
                        rec.id, external_id=seen.external_id, detail=seen.detail,
                    )  # fmt: skip
                    log.info("instance %s: adopted %s after a restart", rec.id, seen.external_id)
                else:
                    why = "the control plane stopped while creating it; the provider has none"
                    await self._failed(intent.seq, rec, why)
                    log.info("instance %s: %s", rec.id, why)
            else:  # terminate: do it again (idempotent), then record it
                if provider is not None and seen is not None and seen.state != "ended":
                    await provider.terminate(seen.external_id)
                await self._end(rec, intent.seq, "terminated after a restart", _S.gone,
                                rec.reason or "terminated")  # fmt: skip

    async def sweep(self) -> tuple[list[str], list[str]]:
        """The orphan sweep at start: terminate provider instances the store does not
        know (or has ended); mark store instances the provider no longer has ``lost``.
        Returns (terminated external ids, instance ids marked lost)."""
        core = self._core
        active = {r.id: r for r in await core.store.active_instances()}
        killed: list[str] = []
        lost: list[str] = []
        for name, provider in self.providers.items():
            try:
                seen = await provider.list()
            except Exception as e:
                log.warning("orphan sweep: provider %s did not answer: %s", name, e)
                continue
            live = {s.instance_id: s for s in seen if s.state != "ended"}
            for s in live.values():
                if s.instance_id not in active:
                    log.warning("orphan sweep: terminating %s at %s (unknown to the store)",
                                s.external_id, name)  # fmt: skip
                    await provider.terminate(s.external_id)
                    killed.append(s.external_id)
            for rec in active.values():
                if rec.provider == name and rec.external_id and rec.id not in live:
                    await self._end(rec, None, "", _S.lost, f"{name} no longer has it")
                    lost.append(rec.id)
        return killed, lost

    # --------------------------------------------------------------- reads

    async def get(self, instance_id: str) -> InstanceRecord:
        """An instance by id, or :class:`NotFound`."""
        rec = await self._core.store.get_instance(instance_id)
        if rec is None:
            raise NotFound(f"no instance with id {instance_id!r}")
        return rec

    async def all(self) -> list[Instance]:
        """Active instances, then recent ended ones, with their cost so far."""
        now = self._core.clock()
        return [r.model(now) for r in await self._core.store.list_instances()]

    async def stop_by_admin(self, instance_id: str, who: str) -> Instance:
        """``POST instances/{id}/terminate``: end an instance now (its running tasks
        end lost and are retried)."""
        rec = await self.get(instance_id)
        if rec.state.active:
            await self.terminate(rec, f"terminated by {who}")
        return (await self.get(instance_id)).model(self._core.clock())
