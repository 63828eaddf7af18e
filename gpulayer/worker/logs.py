"""Log shipping: one task's lines, numbered and sent in order, batched, resent until acknowledged.

Each line gets a per-task ``seq`` from 0. The control plane stores a batch's lines
from the first one it does not have yet, so a batch sent again after a lost answer
is stored once, and a follower sees every line once, in order (docs/api.md).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from gpulayer import contracts as c
from gpulayer.worker.runs import wake

log = logging.getLogger(__name__)

MAX_BATCH_LINES = 1000
MAX_LINE_CHARS = 65536  # LogEntry.text limit; longer lines travel in pieces
MAX_BATCH_CHARS = 2 * 1024 * 1024  # well below the control plane's request body limit
#: At most this much text rides a completion (which may carry an inline result too).
MAX_RIDE_CHARS = 256 * 1024


class LogShipper:
    """Numbers one task's lines from 0 and ships them in order, batched, one request
    in flight, resending what the control plane has not acknowledged.

    ``send`` posts one batch and answers the :class:`~gpulayer.contracts.LogAck`, or
    ``None`` when the control plane will never take this task's lines.
    """

    def __init__(
        self,
        task_id: str,
        send: Callable[[c.LogBatch], Awaitable[c.LogAck | None]],
        *,
        batch_seconds: float,
    ) -> None:
        self.task_id = task_id
        self._send = send
        self._batch_seconds = batch_seconds
        self._unacked: list[c.LogEntry] = []
        self._first_seq = 0  # seq of self._unacked[0]
        self._arrived = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._urgent = False  # set by flush(): stop gathering, send now
        self._gathering: asyncio.Future[None] | None = None  # run()'s wait, while it waits
        self._stopped = False
        self._held = False  # the rest goes with the completion (take_rest)
        self._idle = asyncio.Event()  # no batch on its way
        self._idle.set()
        self._sent_at = -1e9  # loop time the last batch went (long ago: the first goes at once)
        self._on_demand = False  # run() started by the first line (start_on_demand)
        self._loop_task: asyncio.Task[None] | None = None

    def start_on_demand(self) -> None:
        """Run :meth:`run` in a task of its own from the first line (or flush) on, and
        end it with :meth:`stop`: a call that prints nothing costs no task."""
        self._on_demand = True

    def _wake(self) -> None:
        """Lines to ship: wake the loop (start it, on demand)."""
        self._arrived.set()
        if self._on_demand and self._loop_task is None and self._unacked and not self._stopped:
            self._loop_task = asyncio.get_running_loop().create_task(
                self.run(), name=f"logs-{self.task_id}"
            )

    @property
    def produced(self) -> int:
        """Lines queued so far, shipped or not (heartbeats report it, so the control
        plane can say how many were lost with a dead worker)."""
        return self._first_seq + len(self._unacked)

    def add(
        self,
        stream: c.LogStream,
        text: str,
        ts: datetime,
        rank: int | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """Queue one line (the :data:`~gpulayer.worker.runs.LineCallback`); ``rank``
        is the global rank of a gang's process that wrote it. A line to ``hold``
        (the worker's own ``started on …``) never goes at once after a quiet
        spell: it waits the batch time, so a short task's rides its completion."""
        if self._stopped:
            return
        if hold:
            self._sent_at = max(self._sent_at, asyncio.get_running_loop().time())
        for i in range(0, max(len(text), 1), MAX_LINE_CHARS):
            self._unacked.append(
                c.LogEntry(stream=stream, ts=ts, text=text[i : i + MAX_LINE_CHARS], rank=rank)
            )
        self._drained.clear()
        self._wake()

    async def flush(self) -> None:
        """Wait until every line queued so far is acknowledged (or given up on)."""
        self._hurry()  # from now on nothing is worth waiting for
        self._wake()
        await self._drained.wait()

    async def take_rest(self) -> c.LogBatch | None:
        """The lines not acknowledged yet, as one batch for the task's completion
        to carry (None when there are none): one round trip fewer at a task's end.

        From now on the shipper sends nothing by itself; a batch already on its
        way lands first, and lines beyond what may ride (one batch, at most
        :data:`MAX_RIDE_CHARS`) are shipped first. Then call :meth:`taken` with
        the completion's outcome.
        """
        self._held = True
        await self._idle.wait()
        while not self._stopped and self._more_than_a_ride():
            await self._ship_one()
        if self._stopped or not self._unacked:
            return None
        return c.LogBatch(seq=self._first_seq, lines=list(self._unacked))

    def _more_than_a_ride(self) -> bool:
        """Too many lines, or too much text, to ride a completion."""
        if len(self._unacked) > MAX_BATCH_LINES:
            return True
        return sum(len(e.text) for e in self._unacked) > MAX_RIDE_CHARS

    def taken(self, batch: c.LogBatch | None, stored: bool) -> None:
        """The completion that carried ``batch`` was answered: ``stored`` when it
        succeeded (its lines are held now); otherwise the shipper sends them again
        as usual."""
        self._held = False
        if stored and batch is not None and batch.seq == self._first_seq:
            taken = min(len(batch.lines), len(self._unacked))
            del self._unacked[:taken]
            self._first_seq += taken
        if self._unacked:
            self._wake()
        else:
            self._drained.set()

    def stop(self) -> None:
        """Drop what is queued and ship nothing more."""
        self._stopped = True
        self._unacked.clear()
        self._drained.set()
        self._arrived.set()
        self._hurry()  # run() ends now, even while it gathers a batch
        if self._loop_task is not None:
            self._loop_task.cancel()

    async def run(self) -> None:
        """The shipping loop; runs until :meth:`stop`."""
        while not self._stopped:
            await self._arrived.wait()
            self._arrived.clear()
            quiet = asyncio.get_running_loop().time() - self._sent_at
            if (
                self._unacked
                and len(self._unacked) < MAX_BATCH_LINES
                and quiet < self._batch_seconds
            ):
                # A burst: gather its lines until batch_seconds after the last batch,
                # unless a flush wants them now. After a quiet spell the first line
                # goes at once (a cell's first output, a prompt), and lines that
                # arrive while it is on its way make the next batch.
                await self._gather(self._batch_seconds - quiet)
            while self._unacked and not self._stopped and not self._held:
                try:
                    await self._ship_one()
                except Exception:  # a background task boundary: never leave flush() hanging
                    log.exception("task %s: log shipping failed; dropping its lines", self.task_id)
                    self.stop()
            if not self._unacked:
                self._drained.set()

    def _hurry(self) -> None:
        """Stop gathering: what is queued goes now, and from now on at once."""
        self._urgent = True
        wake(self._gathering)

    async def _gather(self, seconds: float) -> None:
        """Wait ``seconds``, or until :meth:`_hurry`: one future and a timer (a wait
        for an event with a timeout would run a task of its own)."""
        if self._urgent:
            return
        loop = asyncio.get_running_loop()
        fut = self._gathering = loop.create_future()
        timer = loop.call_later(seconds, wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._gathering = None

    async def _ship_one(self) -> None:
        self._idle.clear()
        try:
            await self._send_first()
        finally:
            self._idle.set()

    async def _send_first(self) -> None:
        batch = self._unacked[:MAX_BATCH_LINES]
        size = 0
        for n, entry in enumerate(batch):  # a cell's images make long lines: cap the bytes too
            size += len(entry.text)
            if size > MAX_BATCH_CHARS and n > 0:
                batch = batch[:n]
                break
        self._sent_at = asyncio.get_running_loop().time()
        ack = await self._send(c.LogBatch(seq=self._first_seq, lines=batch))
        if ack is None:
            self.stop()
            return
        taken = ack.next_seq - self._first_seq
        if taken <= 0:
            # The server refuses lines from here on; resending would loop forever.
            log.warning(
                "task %s: control plane holds %d lines, not taking seq %d; dropping %d lines",
                self.task_id,
                ack.next_seq,
                self._first_seq,
                len(batch),
            )
            taken = len(batch)
        taken = min(taken, len(self._unacked))
        del self._unacked[:taken]
        self._first_seq += taken
