"""Wake-ups for long polls: acquire, job wait and log follow.

A long-poll handler asks :meth:`Notifier.wait_for` to run its check, and to run it
again each time someone calls :meth:`Notifier.notify` on the same key, until the
check returns something or the hold runs out. The waiter is registered *before*
the check runs, so a notify that lands while the check awaits the database is
never lost (the pattern of tornado's chat demo, plus a hold timeout).
"""

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def worker_key(worker_id: str) -> str:
    """Key notified when a worker has new assignments or cancels."""
    return f"worker:{worker_id}"


def job_key(job_id: str) -> str:
    """Key notified when a job changes state."""
    return f"job:{job_id}"


def logs_key(job_id: str) -> str:
    """Key notified when a job has new log lines (or ends)."""
    return f"logs:{job_id}"


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class Notifier:
    """Keyed one-shot wake-ups on the control plane's event loop."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = defaultdict(set)

    def notify(self, key: str) -> None:
        """Wake every waiter of ``key``."""
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    def listening(self, key: str) -> bool:
        """Whether a long poll waits on ``key`` now (a worker's acquire is parked)."""
        return bool(self._waiters.get(key))

    def waiting(self) -> int:
        """How many long polls are open (for activity reports)."""
        return sum(len(s) for s in self._waiters.values())

    async def wait_for(
        self,
        key: str | Sequence[str],
        check: Callable[[], Awaitable[T | None]],
        timeout: float,
    ) -> T | None:
        """Return ``check()``'s first non-None result, or None after ``timeout`` s;
        ``check`` runs again whenever ``key`` (or any of several keys) is notified."""
        keys = [key] if isinstance(key, str) else list(key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            for k in keys:
                self._waiters[k].add(fut)
            try:
                result = await check()
                if result is not None:
                    return result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                # A timer resolves the same future: a notify wakes this coroutine in
                # one turn of the loop (``asyncio.wait_for`` takes two), so a writer
                # that yields once (``await asyncio.sleep(0)``) lets it answer first.
                timer = loop.call_later(remaining, _wake, fut)
                try:
                    await fut
                finally:
                    timer.cancel()
            finally:
                for k in keys:
                    waiters = self._waiters.get(k)
                    if waiters is not None:
                        waiters.discard(fut)
                        if not waiters:
                            del self._waiters[k]
