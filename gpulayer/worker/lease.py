"""What the worker knows of its lease, and when it must stop its tasks.

The control plane renews the lease of every task a heartbeat lists (and a
registration lists) to ``now + lease_seconds`` when it answers, and gives a
task whose lease ran out to another worker. The worker cannot see that clock,
but it knows when it *sent* the last heartbeat that was answered: the renewal
happened after that. So, counting from that moment (docs/adr/0082-fencing.md):

``stop_at`` = sent + ``lease_seconds`` − 2 × ``heartbeat_seconds``
    the agent stops its tasks (as a cancel does) and reports them ``lost``;
``kill_at`` = sent + ``lease_seconds`` − ``heartbeat_seconds``
    the supervisor SIGKILLs whatever still runs, even when the agent itself is
    frozen (SIGSTOP) and cannot act (:class:`~gpulayer.worker.spawning.Fence`).

Both come before the control plane's own expiry, so no retry starts while the
first attempt may still run. The margins shrink for a lease shorter than four
heartbeats (half and a quarter of the lease).
"""

import asyncio
import time
from collections.abc import Callable

from gpulayer.contracts import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_LEASE_SECONDS
from gpulayer.worker.spawning import Fence


class Lease:
    """The worker's lease as the agent sees it (times are ``time.monotonic()``)."""

    def __init__(
        self,
        fence: Fence | None = None,
        *,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fence = fence
        self._clock = clock
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_seconds = lease_seconds
        self.renewed_at: float | None = None  # when the last answered heartbeat was sent
        self.lapsed = False  # the tasks were stopped: the lease may be gone
        self._renewed = asyncio.Event()

    def configure(self, heartbeat_seconds: float, lease_seconds: float) -> None:
        """Follow the control plane's timings (from its registration answer)."""
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_seconds = lease_seconds

    @property
    def _margin(self) -> float:
        return min(2 * self.heartbeat_seconds, self.lease_seconds / 2)

    @property
    def stop_at(self) -> float | None:
        """When the agent stops its tasks unless the lease is renewed first."""
        return None if self.renewed_at is None else self._stop_after(self.renewed_at)

    def _stop_after(self, sent_at: float) -> float:
        """``stop_at`` for a lease renewed by an answer to a request sent at ``sent_at``."""
        return sent_at + self.lease_seconds - self._margin

    @property
    def kill_at(self) -> float | None:
        """When the supervisor kills what still runs unless the lease is renewed first."""
        if self.renewed_at is None:
            return None
        return self.renewed_at + self.lease_seconds - self._margin / 2

    def now(self) -> float:
        return self._clock()

    def renewed(self, sent_at: float) -> None:
        """The control plane answered a heartbeat (or registration) sent at ``sent_at``.

        An answer that took so long that the lease it renewed would already be
        stopped (a heartbeat sent as the network went down, answered once it came
        back) renews nothing: a lapsed lease stays lapsed until an answer to a
        newer request. Taking it would end the lapse only for the next check to
        find it lapsed again, and stop a task that started in between."""
        if self.renewed_at is not None and sent_at <= self.renewed_at:
            return
        if self.lapsed and self._stop_after(sent_at) <= self._clock():
            return
        self.renewed_at = sent_at
        self.lapsed = False
        kill_at = self.kill_at
        if self._fence is not None and kill_at is not None:
            self._fence.hold_until(kill_at)
        self._renewed.set()

    def overdue(self) -> bool:
        """Whether ``stop_at`` has passed (the tasks may be another worker's by now)."""
        stop_at = self.stop_at
        return self.lapsed or (stop_at is not None and self._clock() >= stop_at)

    async def renewal(self) -> None:
        """Return at the next renewal."""
        self._renewed.clear()
        await self._renewed.wait()

    async def lapse(self) -> None:
        """Return once ``stop_at`` has passed without a renewal (then :attr:`lapsed`)."""
        while True:
            self._renewed.clear()
            stop_at = self.stop_at
            wait = None if stop_at is None else stop_at - self._clock()
            if wait is not None and wait <= 0:
                self.lapsed = True
                return
            try:
                await asyncio.wait_for(self._renewed.wait(), wait)
            except TimeoutError:
                continue  # check again: a renewal may have come in between
