"""Worker-facing REST handlers: register, heartbeat, acquire, task logs/artifacts/completion.

Workers call out to the control plane (never the other way), so a GPU box behind
NAT can join. Every route here takes a bearer token: the join token for
``register``, the worker's own token for the rest.
"""

import pydantic
from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import (
    ArtifactName,
    Heartbeat,
    LogBatch,
    TaskCompletion,
    WorkerRegistration,
)
from gpulayer.errors import Forbidden, NotFound, PayloadTooLarge, ValidationError

from .auth import requires
from .handlers import GpulayerAPIHandler

_ARTIFACT_NAME = pydantic.TypeAdapter(ArtifactName)


class WorkerRouteHandler(GpulayerAPIHandler):
    """Base: a worker token may act only for its own worker id."""

    def own(self, worker_id: str) -> None:
        """Refuse a worker token acting for another worker."""
        p = self.principal
        if p is not None and p.role == "worker" and p.worker_id != worker_id:
            raise Forbidden("a worker token may only act for its own worker")


class RegisterHandler(WorkerRouteHandler):
    """``POST workers/register`` with the join token."""

    @allow_unauthenticated
    @requires("join")
    async def post(self) -> None:
        """Admit the worker; answers its own token."""
        reg = self.parse(WorkerRegistration)
        assert self.principal is not None
        await self.gl.tokens.use(self.principal)  # a single-use join token is spent now
        self.reply(await self.gl.scheduler.register(reg))


class HeartbeatHandler(WorkerRouteHandler):
    """``POST workers/{id}/heartbeat``."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, worker_id: str) -> None:
        """Renew leases; answer the tasks to kill."""
        self.own(worker_id)
        hb = self.parse(Heartbeat)
        self.reply(await self.gl.scheduler.heartbeat(worker_id, hb))


class AcquireHandler(WorkerRouteHandler):
    """``POST workers/{id}/acquire?wait=S``: long poll for assignments and cancels."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, worker_id: str) -> None:
        """200 with ``Acquired`` the moment there is work, else 204 after the hold."""
        self.own(worker_id)
        hold = self.gl.config.long_poll_seconds
        wait = self.float_arg("wait", hold, hold)
        got = await self.long_poll(self.gl.scheduler.acquire(worker_id, wait))
        if got is None:
            self.no_content()
        else:
            self.reply(got)


class TaskLogsHandler(WorkerRouteHandler):
    """``POST tasks/{id}/logs``: a batch of a task's lines."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Store the batch; answer how many lines the task now has."""
        batch = self.parse(LogBatch)
        if len(batch.lines) > self.gl.config.max_log_batch_lines:
            raise PayloadTooLarge(
                f"a log batch holds at most {self.gl.config.max_log_batch_lines} lines",
                field="lines",
            )
        assert self.principal is not None
        self.reply(await self.gl.scheduler.append_logs(self.principal, task_id, batch))


class TaskArtifactHandler(WorkerRouteHandler):
    """``PUT tasks/{id}/artifacts/{name}``: a file the task wrote."""

    @property
    def max_body_bytes(self) -> int:
        """Artifacts may be large."""
        return self.settings["gpulayer"].config.max_blob_bytes

    @allow_unauthenticated
    @requires("worker")
    async def put(self, task_id: str, name: str) -> None:
        """Store the body as the artifact ``name`` of the task's job."""
        try:
            name = _ARTIFACT_NAME.validate_python(name)
        except pydantic.ValidationError as e:
            raise ValidationError(
                f"artifact name {name!r} must be a relative path without '..'", field="name"
            ) from e
        assert self.principal is not None
        art = await self.gl.scheduler.add_artifact(self.principal, task_id, name, self.request.body)
        self.reply(art, 201)


class TaskResultHandler(WorkerRouteHandler):
    """``PUT tasks/{id}/result``: a function task's outcomes too large to send inline."""

    @property
    def max_body_bytes(self) -> int:
        """Results may be as large as an artifact."""
        return self.settings["gpulayer"].config.max_blob_bytes

    @allow_unauthenticated
    @requires("worker")
    async def put(self, task_id: str) -> None:
        """Keep the body; the completion then names it as ``result_blob``."""
        assert self.principal is not None
        ref = await self.gl.scheduler.add_result(self.principal, task_id, self.request.body)
        self.reply(ref, 201)


class TaskCompleteHandler(WorkerRouteHandler):
    """``POST tasks/{id}/complete``."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Record the task's end (idempotent)."""
        done = self.parse(TaskCompletion)
        assert self.principal is not None
        self.reply(await self.gl.scheduler.complete(self.principal, task_id, done))


class BlobHandler(WorkerRouteHandler):
    """``GET blobs/{sha256}``: a stored blob (a job's bundle)."""

    @allow_unauthenticated
    @requires("worker")
    async def get(self, sha256: str) -> None:
        """Send the blob's bytes."""
        blobs = self.gl.blobs
        p = self.principal
        if p is not None and p.role == "worker":
            assert p.worker_id is not None
            store = self.gl.store
            if not (
                await store.worker_has_bundle(p.worker_id, sha256)
                or await store.worker_has_push(p.worker_id, sha256)
            ):
                raise Forbidden("a worker token may only read the bundles of its own tasks")
        if not blobs.exists(sha256):
            raise NotFound(f"no blob {sha256!r}")
        self.finish(await blobs.read(sha256), set_content_type="application/octet-stream")


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"workers/register", RegisterHandler),
    (r"workers/(?P<worker_id>[^/]+)/heartbeat", HeartbeatHandler),
    (r"workers/(?P<worker_id>[^/]+)/acquire", AcquireHandler),
    (r"tasks/(?P<task_id>[^/]+)/logs", TaskLogsHandler),
    (r"tasks/(?P<task_id>[^/]+)/artifacts/(?P<name>.+)", TaskArtifactHandler),
    (r"tasks/(?P<task_id>[^/]+)/result", TaskResultHandler),
    (r"tasks/(?P<task_id>[^/]+)/complete", TaskCompleteHandler),
    (r"blobs/(?P<sha256>[^/]+)", BlobHandler),
]
