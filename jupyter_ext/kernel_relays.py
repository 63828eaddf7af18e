"""Kernel relays: a gpulayer kernel's Jupyter channels, paired by job id
(docs/kernels.md, docs/adr/0125).

A gpulayer kernel is a relay session (``SessionSpec.relay``). Its Jupyter server
(the kernel provisioner) opens ``GET kernels/{job_id}/channel`` and its worker
opens ``GET workers/{worker_id}/kernels/{job_id}/channel``; :class:`KernelRelays`
pairs the two WebSockets. Each binary frame from one side is written to the other
as it is (the plane never reads Jupyter messages: they are unsigned relay frames,
see :mod:`gpulayer.kernel_relay`); a frame while the other side is absent is
dropped. The client is told ``ready`` (a text frame) once the worker's end is
attached. At most one client is attached; a new one replaces the old one, which is
closed with :data:`~gpulayer.contracts.CLOSE_REPLACED`.

The worker's end also sends text frames with the kernel's execution state
(``busy``/``idle``): a busy kernel is never idle-expired, and frames from the
client count as activity, so gpulayer's session idle expiry measures what
Jupyter's culler measures.

**Detach grace**: a running relay session with no client attached for
``kernel_detach_seconds`` is ended (its GPUs released): that covers a Jupyter
server killed with ``-9`` and one restarted without reattaching.
"""

import logging
from dataclasses import dataclass, field
from typing import Protocol

from gpulayer.contracts import (
    CLOSE_KERNEL_DIED,
    CLOSE_KERNEL_ENDED,
    CLOSE_REPLACED,
    KERNEL_READY,
    JobKind,
    JobState,
)
from gpulayer.errors import Forbidden, InvalidTransition, NotFound

from . import access
from .auth import Principal
from .core import Core
from .sessions import Sessions
from .store import JobRecord

log = logging.getLogger(__name__)


class Peer(Protocol):
    """One side of a relay: a WebSocket handler."""

    def relay(self, frame: bytes | str) -> None:
        """Write a frame to the peer (dropped, or the socket closed, when it lags)."""
        ...

    def close_relay(self, code: int, why: str) -> None:
        """Close the socket with a code and reason."""
        ...


class Canceller(Protocol):
    """What the relays need of the job service."""

    async def cancel(self, job_id: str, by: str, *, reason: str | None = None) -> object:
        """Cancel a job."""
        ...


@dataclass
class Relay:
    """One kernel's two sides."""

    job_id: str
    key: tuple[str, str]  # the session: (owner, name)
    client: Peer | None = None
    worker: Peer | None = None
    #: When the client last detached (None while one is attached).
    detached_since: float | None = None
    ended: bool = field(default=False)


def _end_code(state: JobState) -> int:
    return (
        CLOSE_KERNEL_ENDED
        if state in (JobState.succeeded, JobState.cancelled)
        else CLOSE_KERNEL_DIED
    )


class KernelRelays:
    """The open kernel relays, by job id."""

    def __init__(
        self,
        core: Core,
        sessions: Sessions,
        jobs: Canceller,
        *,
        detach_seconds: float = 120.0,
    ) -> None:
        self._core = core
        self._sessions = sessions
        self._jobs = jobs
        self.detach_seconds = detach_seconds
        self._relays: dict[str, Relay] = {}
        self._started = core.clock()  # a restart's grace counts from here

    # ------------------------------------------------------------ admission

    async def admit_client(self, job_id: str, who: Principal) -> None:
        """Refuse a client that may not attach to kernel ``job_id`` (only its owner may).

        Raises
        ------
        NotFound
            When there is none, it is not a kernel, it is another owner's (never
            said), or it has ended.
        """
        row = await self._core.store.get_job(job_id)
        if row is None or row.owner != who.name or not self._is_relay(row):
            raise NotFound(f"no gpulayer kernel {job_id}")
        if row.ended:
            raise NotFound(f"gpulayer kernel {job_id} has ended ({row.state}: {row.reason})")
        self._relay(row)

    async def admit_worker(self, worker_id: str, job_id: str, who: Principal) -> None:
        """Refuse a worker's end unless kernel ``job_id``'s task runs on ``worker_id``.

        Raises
        ------
        Forbidden
            Another worker's token.
        NotFound
            No such kernel task running on that worker.
        """
        if who.role != "worker":  # not even an admin: it would take the kernel's place
            raise Forbidden("only the worker running a kernel opens its end of the relay")
        access.own_worker(who, worker_id)
        row = await self._core.store.get_job(job_id)
        task = None if row is None else await self._core.current_task(job_id)
        if (
            row is None
            or not self._is_relay(row)
            or task is None
            or task.worker_id != worker_id
            or task.state != JobState.running
        ):
            raise NotFound(f"no gpulayer kernel {job_id} runs on this worker")
        self._relay(row)

    def _is_relay(self, row: JobRecord) -> bool:
        spec = self._core.spec(row)
        return spec.kind == JobKind.session and spec.session is not None and spec.session.relay

    def _relay(self, row: JobRecord) -> Relay:
        relay = self._relays.get(row.id)
        if relay is None:
            spec = self._core.spec(row)
            assert spec.session is not None
            relay = Relay(row.id, (row.owner, spec.session.name))
            self._relays[row.id] = relay
        return relay

    # ------------------------------------------------------------ attach

    def attach_client(self, job_id: str, peer: Peer) -> None:
        """A client attached (admitted just before): it replaces any other, and
        hears ``ready`` once the worker's end is there."""
        relay = self._relays.get(job_id)
        if relay is None:  # forgotten since: it ended
            peer.close_relay(CLOSE_KERNEL_ENDED, "the kernel has ended")
            return
        old, relay.client, relay.detached_since = relay.client, peer, None
        if old is not None and old is not peer:
            old.close_relay(CLOSE_REPLACED, "another client attached to this kernel")
        self._sessions.touch(relay.key)
        if relay.worker is not None:
            peer.relay(KERNEL_READY)

    def attach_worker(self, job_id: str, peer: Peer) -> None:
        """The worker's end attached (again): the client may talk to the kernel."""
        relay = self._relays.get(job_id)
        if relay is None:
            peer.close_relay(CLOSE_KERNEL_ENDED, "the kernel has ended")
            return
        old, relay.worker = relay.worker, peer
        if old is not None and old is not peer:
            old.close_relay(CLOSE_REPLACED, "the worker attached again")
        if relay.client is not None:
            relay.client.relay(KERNEL_READY)

    def detach(self, job_id: str, peer: Peer) -> None:
        """``peer`` closed; the grace starts when it was the client."""
        relay = self._relays.get(job_id)
        if relay is None:
            return
        if relay.client is peer:
            relay.client = None
            relay.detached_since = self._core.clock()
        if relay.worker is peer:
            relay.worker = None
        if relay.client is None and relay.worker is None and relay.ended:
            del self._relays[job_id]

    # ------------------------------------------------------------ frames

    def from_client(self, job_id: str, frame: bytes) -> None:
        """A client's frame: to the worker's end, or dropped while it is absent."""
        relay = self._relays.get(job_id)
        if relay is None:
            return
        self._sessions.touch(relay.key)
        if relay.worker is not None:
            relay.worker.relay(frame)

    def from_worker(self, job_id: str, frame: bytes) -> None:
        """A kernel's frame: to the client, or dropped while none is attached."""
        relay = self._relays.get(job_id)
        if relay is not None and relay.client is not None:
            relay.client.relay(frame)

    def state(self, job_id: str, execution_state: str) -> None:
        """The worker's end says the kernel is ``busy`` or ``idle``."""
        relay = self._relays.get(job_id)
        if relay is not None:
            self._sessions.kernel_state(relay.key, busy=execution_state == "busy")

    async def ended(self, job_id: str) -> None:
        """The kernel's job ended: close both sides with a code that says how."""
        relay = self._relays.get(job_id)
        if relay is None or relay.ended:
            return
        row = await self._core.job(job_id)
        relay.ended = True
        self._sessions.kernel_state(relay.key, busy=False)
        why = f"{row.state}: {row.reason or ''}".rstrip(": ")
        for peer in (relay.client, relay.worker):
            if peer is not None:
                peer.close_relay(_end_code(row.state), why)

    # ------------------------------------------------------------ grace

    async def sweep(self) -> list[str]:
        """End the running kernels no client attached to for ``detach_seconds``;
        returns their job ids."""
        now = self._core.clock()
        ended = []
        active = await self._sessions.active()
        self._forget_ended({r.id for r in active.values()})
        for row in active.values():
            if row.state != JobState.running or not self._is_relay(row):
                continue
            if row.id in self._sessions.ending:
                continue  # asked to end already
            relay = self._relays.get(row.id)
            if relay is not None and relay.client is not None:
                continue
            since = max(row.started_at or now, self._started)
            if relay is not None and relay.detached_since is not None:
                since = max(since, relay.detached_since)
            if now - since <= self.detach_seconds:
                continue
            why = f"ended: no Jupyter client attached for {self.detach_seconds:g}s"
            log.info("kernel job %s: %s", row.id, why)
            try:
                await self._jobs.cancel(row.id, by="gpulayer", reason=why)
            except InvalidTransition:
                continue
            ended.append(row.id)
        return ended

    def _forget_ended(self, active: set[str]) -> None:
        """Drop what is kept of kernels whose job ended and whose sockets closed."""
        for job_id, relay in list(self._relays.items()):
            if job_id not in active and relay.client is None and relay.worker is None:
                self._sessions.kernel_state(relay.key, busy=False)
                del self._relays[job_id]

    def count(self) -> int:
        """Relays with a client attached."""
        return sum(1 for r in self._relays.values() if r.client is not None)
