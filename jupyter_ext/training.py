"""Training metrics: the points a job's tasks ship, stored per job and followed.

A worker follows each task's ``$GPULAYER_METRICS_FILE`` (the JSON lines that
:class:`gpulayer.pytorch.metrics.JsonlSink` writes on rank 0) and posts the
points in batches (``POST tasks/{id}/metrics``); like log batches, each carries
the task-local number of its first point, so a batch sent twice is stored once.
Readers page through a job's points with ``GET jobs/{id}/metrics?after=SEQ``,
optionally holding the request until a newer point arrives (``wait``).
"""

import json
from typing import TYPE_CHECKING

from gpulayer.contracts import MetricAck, MetricBatch, MetricPage, StoredMetricPoint
from gpulayer.errors import Conflict

from .auth import Principal
from .store import as_datetime
from .streams import job_key
from .transitions import TERMINAL

if TYPE_CHECKING:
    from .scheduler import Scheduler


def metrics_key(job_id: str) -> str:
    """The notifier key woken when a job gets new metric points."""
    return f"metrics:{job_id}"


class TrainingMetrics:
    """Store and serve metric points; a thin layer over the scheduler's store."""

    def __init__(self, scheduler: "Scheduler") -> None:
        self.scheduler = scheduler
        self.store = scheduler.store

    async def append(self, principal: Principal, task_id: str, batch: MetricBatch) -> MetricAck:
        """Keep the batch's points the task does not have yet."""
        task = await self.scheduler._own_task(principal, task_id)
        if task["state"] in TERMINAL:
            raise Conflict(f"task {task_id} already {task['state']}; its metrics are closed")
        n = await self.store.append_metrics(
            task_id,
            task["job_id"],
            batch.seq,
            [
                (p.rank, p.step, p.epoch, p.ts.timestamp(), json.dumps(p.metrics))
                for p in batch.points
            ],
        )
        self.scheduler.notifier.notify(metrics_key(task["job_id"]))
        return MetricAck(next_seq=n)

    async def page(self, job_id: str, after: int, limit: int, wait: float) -> MetricPage:
        """Points with ``seq > after``; waits up to ``wait`` s for the first new one."""
        await self.scheduler._job_row(job_id)

        async def read(force: bool) -> MetricPage | None:
            job = await self.store.get_job(job_id)
            assert job is not None
            ended = job["state"] in TERMINAL
            rows = await self.store.read_metrics(job_id, after, limit)
            if not rows and not ended and not force:
                return None
            points = [
                StoredMetricPoint(
                    seq=r["seq"],
                    task_id=r["task_id"],
                    rank=r["rank"],
                    step=r["step"],
                    epoch=r["epoch"],
                    ts=as_datetime(r["ts"]),
                    metrics=json.loads(r["metrics"]),
                )
                for r in rows
            ]
            nxt = points[-1].seq if points else after
            return MetricPage(points=points, next_after=nxt, complete=ended and len(rows) < limit)

        if wait > 0:
            keys = [metrics_key(job_id), job_key(job_id)]
            found = await self.scheduler.notifier.wait_for(keys, lambda: read(False), wait)
            if found is not None:
                return found
        page = await read(True)
        assert page is not None
        return page
