"""Training metrics shipping: follow a task's ``$GPULAYER_METRICS_FILE``, post the points.

:class:`gpulayer.pytorch.metrics.JsonlSink` appends one JSON object per log point
on rank 0 (``{"step", "epoch", "rank", "ts", "metrics"}``).
:class:`TrainingMetricsFollower` reads complete lines as they appear, numbers the
points from 0 per task and posts them in batches; like log batches, a batch sent
again after a lost answer is stored once. Lines that are not such objects are
skipped (and counted in the worker log).
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pydantic

from gpulayer import contracts as c
from gpulayer.worker.workspace import open_owned

log = logging.getLogger(__name__)

METRICS_FILE_ENV = "GPULAYER_METRICS_FILE"
MAX_BATCH_POINTS = 1000


class TrainingMetricsFollower:
    """Follows one metrics file; ``send`` posts a batch and answers the ack (or None
    when the control plane will never take this task's points)."""

    def __init__(
        self,
        path: Path,
        send: Callable[[c.MetricBatch], Awaitable[c.MetricAck | None]],
        *,
        interval_seconds: float = 0.25,
    ) -> None:
        self.path = path
        self._send = send
        self._interval = interval_seconds
        self._offset = 0
        self._partial = b""
        self._points: list[c.MetricPoint] = []
        self._first_seq = 0
        self._closed = False
        self._lock = asyncio.Lock()

    async def run(self) -> None:
        """Poll the file until cancelled."""
        while not self._closed:
            await asyncio.sleep(self._interval)
            await self.flush()

    async def flush(self) -> None:
        """Read what is new and ship every point read so far."""
        async with self._lock:
            if self._closed:
                return
            self._read()
            while self._points and not self._closed:
                batch = self._points[:MAX_BATCH_POINTS]
                ack = await self._send(c.MetricBatch(seq=self._first_seq, points=batch))
                if ack is None:
                    self._closed = True
                    return
                taken = ack.next_seq - self._first_seq
                if taken <= 0:  # the server refuses these: resending would loop forever
                    taken = len(batch)
                taken = min(taken, len(self._points))
                del self._points[:taken]
                self._first_seq += taken

    def close(self) -> None:
        """Ship nothing more."""
        self._closed = True

    def _read(self) -> None:
        try:
            with open_owned(self.path) as f:  # the task's own file, never a link it planted
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("not following %s: %s", self.path, e)
            self._closed = True
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            if raw.strip():
                point = _point(raw)
                if point is not None:
                    self._points.append(point)


def _point(raw: bytes) -> c.MetricPoint | None:
    try:
        obj = json.loads(raw)
        ts = obj.get("ts")
        when = datetime.fromtimestamp(float(ts), UTC) if ts is not None else datetime.now(UTC)
        return c.MetricPoint(
            step=obj.get("step"),
            epoch=obj.get("epoch"),
            rank=obj.get("rank"),
            ts=when,
            metrics=obj.get("metrics") or {},
        )
    except (ValueError, TypeError, AttributeError, pydantic.ValidationError) as e:
        log.warning("skipping a metrics line that is not a point: %s", e)
        return None
