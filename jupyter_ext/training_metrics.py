"""Training metrics: the points a job's tasks ship, stored per job and followed.

A worker follows each task's ``$GPULAYER_METRICS_FILE`` (the JSON lines that
:class:`gpulayer.pytorch.metrics.JsonlSink` writes on rank 0) and posts the
points in batches (``POST tasks/{id}/metrics``); like log batches, each carries
the task-local number of its first point, so a batch sent twice is stored once.
Readers page through a job's points with ``GET jobs/{id}/metrics?after=SEQ``,
optionally holding the request until a newer point arrives (``wait``).

(Not to be confused with ``prometheus.py``, the control plane's own exposition.)
"""

import json

from gpulayer.contracts import MetricAck, MetricBatch, MetricPage, StoredMetricPoint

from .auth import Principal
from .core import Core
from .jobs import Jobs
from .store import MetricRecord, as_datetime
from .streams import job_key
from .tasks import Tasks


def metrics_key(job_id: str) -> str:
    """The notifier key woken when a job gets new metric points."""
    return f"metrics:{job_id}"


class TrainingMetrics:
    """Store and serve a job's training metric points."""

    def __init__(self, core: Core, jobs: Jobs, tasks: Tasks) -> None:
        self._core = core
        self._jobs = jobs
        self._tasks = tasks

    async def append(
        self, reporter: Principal | None, task_id: str, batch: MetricBatch
    ) -> MetricAck:
        """Keep the batch's points the task does not have yet."""
        task = await self._tasks.open_task(reporter, task_id, "metrics")
        points = [
            (p.rank, p.step, p.epoch, p.ts.timestamp(), json.dumps(p.metrics)) for p in batch.points
        ]
        n = await self._core.store.append_metrics(task_id, task.job_id, batch.seq, points)
        self._core.notifier.notify(metrics_key(task.job_id))
        return MetricAck(next_seq=n)

    async def page(
        self, job_id: str, after: int, limit: int, wait: float, viewer: Principal | None = None
    ) -> MetricPage:
        """Points with ``seq > after``; waits up to ``wait`` s for the first new one."""
        await self._jobs.visible(job_id, viewer)

        async def read(force: bool) -> MetricPage | None:
            ended = (await self._core.job(job_id)).ended
            rows = await self._core.store.read_metrics(job_id, after, limit)
            if not rows and not ended and not force:
                return None
            points = [_point(r) for r in rows]
            nxt = points[-1].seq if points else after
            return MetricPage(points=points, next_after=nxt, complete=ended and len(rows) < limit)

        if wait > 0:
            keys = [metrics_key(job_id), job_key(job_id)]
            found = await self._core.notifier.wait_for(keys, lambda: read(False), wait)
            if found is not None:
                return found
        page = await read(True)
        assert page is not None
        return page


def _point(r: MetricRecord) -> StoredMetricPoint:
    return StoredMetricPoint(
        seq=r.seq,
        task_id=r.task_id,
        rank=r.rank,
        step=r.step,
        epoch=r.epoch,
        ts=as_datetime(r.ts),
        metrics=json.loads(r.metrics_json),
    )
