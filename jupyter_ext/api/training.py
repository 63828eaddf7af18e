"""Training-metric routes: workers post points, users read them (``training_metrics.py``)."""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import MetricBatch
from gpulayer.errors import PayloadTooLarge

from ..auth import requires
from .base import GpulayerAPIHandler

_MAX_POINTS = 10000


class TaskMetricsHandler(GpulayerAPIHandler):
    """``POST tasks/{id}/metrics``: a batch of a task's metric points (worker token)."""

    @property
    def max_body_bytes(self) -> int:
        """Batches have their own limit."""
        return self.limits.max_batch_bytes

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Store the batch; answer how many points the task now has."""
        batch = self.parse(MetricBatch)
        if len(batch.points) > _MAX_POINTS:
            raise PayloadTooLarge(f"a metric batch holds at most {_MAX_POINTS} points")
        self.reply(await self.gl.training_metrics.append(self.who, task_id, batch))


class JobMetricsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/metrics?after=&limit=&wait=``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """Points after ``after``; with ``wait`` a long poll for the next ones."""
        await self.gl.jobs.visible(job_id, self.who)
        after = self.int_arg("after", 0, 0, 2**62)
        limit = self.int_arg("limit", 1000, 1, 10000)
        wait = self.wait_arg()
        metrics = self.gl.training_metrics
        page = await self.long_poll(metrics.page(job_id, after, limit, wait, self.who))
        if page is not None:
            self.reply(page)


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"tasks/(?P<task_id>[^/]+)/metrics", TaskMetricsHandler),
    (r"jobs/(?P<job_id>[^/]+)/metrics", JobMetricsHandler),
]
