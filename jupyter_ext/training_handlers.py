"""REST handlers for training metrics: workers post points, users read them."""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import MetricBatch
from gpulayer.errors import PayloadTooLarge

from .auth import requires
from .handlers import GpulayerAPIHandler
from .training import TrainingMetrics

_MAX_POINTS = 10000


class TaskMetricsHandler(GpulayerAPIHandler):
    """``POST tasks/{id}/metrics``: a batch of a task's metric points (worker token)."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Store the batch; answer how many points the task now has."""
        batch = self.parse(MetricBatch)
        if len(batch.points) > _MAX_POINTS:
            raise PayloadTooLarge(f"a metric batch holds at most {_MAX_POINTS} points")
        assert self.principal is not None
        metrics = TrainingMetrics(self.gl.scheduler)
        self.reply(await metrics.append(self.principal, task_id, batch))


class JobMetricsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/metrics?after=&limit=&wait=``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """Points after ``after``; with ``wait`` a long poll for the next ones."""
        await self.visible_job(job_id)
        after = self.int_arg("after", 0, 0, 2**62)
        limit = self.int_arg("limit", 1000, 1, 10000)
        wait = self.float_arg("wait", 0.0, self.gl.config.long_poll_seconds)
        metrics = TrainingMetrics(self.gl.scheduler)
        page = await self.long_poll(metrics.page(job_id, after, limit, wait))
        if page is not None:
            self.reply(page)


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"tasks/(?P<task_id>[^/]+)/metrics", TaskMetricsHandler),
    (r"jobs/(?P<job_id>[^/]+)/metrics", JobMetricsHandler),
]
