"""Result parts: each call's outcome of a function task of several calls (a
``.map`` chunk), shipped as the call returns, so the calls a task finished outlive
its worker (docs/adr/0096).

A part is sent as soon as its call returns: until the control plane has it, a
worker's death means the call runs again (or fails as ``lost``), so nothing waits to
gather a batch. Parts that come while a request is in flight go in the next one
(one request in flight, resent through outages until the control plane takes them),
so a burst of small calls still costs few requests. They are flushed before the
task's completion. A refusal (409: the task ended or was given up) stops the
shipping: the control plane keeps nothing more from this attempt.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpulayer import contracts as c

log = logging.getLogger(__name__)

MAX_BATCH_PARTS = 1000  # ResultPartBatch.parts' limit
MAX_BATCH_BYTES = 4 * 1024 * 1024  # base64 makes it a third larger: well below max_batch_bytes

#: ``send(batch)``: True once the control plane took it, False when it never will.
Send = Callable[[c.ResultPartBatch], Awaitable[bool]]


class PartShipper:
    """Ships one task's result parts in order, batched, one request in flight."""

    def __init__(self, task_id: str, send: Send) -> None:
        self.task_id = task_id
        self._send = send
        self._queued: list[c.CreateResultPart] = []
        self._arrived = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._stopped = False

    def add(self, index: int, outcome: bytes) -> None:
        """Queue one call's outcome (the runner's ``on_part``)."""
        if self._stopped:
            return
        self._queued.append(c.CreateResultPart(index=index, outcome=outcome))
        self._drained.clear()
        self._arrived.set()

    async def flush(self) -> None:
        """Wait until every part queued so far was taken (or given up on)."""
        self._arrived.set()
        await self._drained.wait()

    def stop(self) -> None:
        """Drop what is queued and ship nothing more."""
        self._stopped = True
        self._queued.clear()
        self._drained.set()
        self._arrived.set()

    async def run(self) -> None:
        """The shipping loop; runs until :meth:`stop`."""
        while not self._stopped:
            await self._arrived.wait()
            self._arrived.clear()
            while self._queued and not self._stopped:
                batch: list[c.CreateResultPart] = []
                size = 0
                for part in self._queued[:MAX_BATCH_PARTS]:
                    size += len(part.outcome)
                    if batch and size > MAX_BATCH_BYTES:
                        break
                    batch.append(part)
                try:
                    taken = await self._send(c.ResultPartBatch(parts=batch))
                except Exception:  # a background task boundary: never leave flush() hanging
                    log.exception("task %s: shipping result parts failed", self.task_id)
                    taken = False
                if not taken:
                    self.stop()
                    break
                del self._queued[: len(batch)]
            if not self._queued:
                self._drained.set()
