"""Worker-facing routes: register, heartbeat, acquire, task logs/artifacts/results/
completion, bundle downloads.

Workers call out to the control plane (never the other way), so a GPU box behind
NAT can join. Every route here takes a bearer token: the join token for
``register`` (new names only), the worker's own token for the rest, including
``workers/{id}/register`` when it comes back (``access.py`` keeps it to its own
worker, tasks and bundles).
"""

from collections.abc import Sized

import pydantic
from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import (
    DEFERRED,
    ArtifactName,
    Heartbeat,
    LogBatch,
    ResultPartBatch,
    TaskCompletion,
    TaskEnvironment,
    WorkerRegistration,
)
from gpulayer.errors import PayloadTooLarge, ValidationError

from ..auth import bearer_token, requires
from .base import GpulayerAPIHandler, Limits

_ARTIFACT_NAME = pydantic.TypeAdapter(ArtifactName, config=DEFERRED)  # built at first use


def _check_reported(limits: Limits, **reported: Sized) -> None:
    """Refuse a registration or heartbeat listing more GPUs or tasks than the
    traits allow (400 naming the list)."""
    for field, items in reported.items():
        devices = field in ("devices", "gpus")
        most = limits.max_heartbeat_devices if devices else limits.max_heartbeat_tasks
        if len(items) > most:
            trait = "max_heartbeat_devices" if devices else "max_heartbeat_tasks"
            raise ValidationError(
                f"{field}: a worker reports at most {most} (c.GpulayerApp.{trait}),"
                f" not {len(items)}",
                field=field,
            )


class RegisterHandler(GpulayerAPIHandler):
    """``POST workers/register`` with the join token."""

    @allow_unauthenticated
    @requires("join")
    async def post(self) -> None:
        """Admit the worker; answers its own token."""
        reg = self.parse(WorkerRegistration)
        _check_reported(self.limits, devices=reg.devices, running_tasks=reg.running_tasks)
        await self.gl.tokens.use(self.who)  # a single-use join token is spent now
        self.reply(await self.gl.workers.register(reg, self.who))


class ReregisterHandler(GpulayerAPIHandler):
    """``POST workers/{id}/register`` with the worker's own token: it comes back."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, worker_id: str) -> None:
        """Admit the worker again under its name; it keeps its token."""
        reg = self.parse(WorkerRegistration)
        presented = bearer_token(self.request.headers.get("Authorization"))
        got = await self.gl.workers.register(
            reg, self.who, worker_id=worker_id, presented=presented
        )
        self.reply(got)


class HeartbeatHandler(GpulayerAPIHandler):
    """``POST workers/{id}/heartbeat``."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, worker_id: str) -> None:
        """Renew leases; answer the tasks to kill."""
        hb = self.parse(Heartbeat)
        _check_reported(self.limits, gpus=hb.gpus, tasks=hb.tasks, running_tasks=hb.running_tasks)
        self.reply(await self.gl.workers.heartbeat(worker_id, hb, self.who))


class AcquireHandler(GpulayerAPIHandler):
    """``POST workers/{id}/acquire?wait=S``: long poll for assignments and cancels."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, worker_id: str) -> None:
        """200 with ``Acquired`` the moment there is work, else 204 after the hold;
        with ``resync=1`` (the worker's previous acquire broke) 200 at once, an
        empty answer when nothing waits (docs/adr/0150)."""
        wait = self.wait_arg(default=self.limits.long_poll_seconds)
        resync = self.int_arg("resync", 0, 0, 1) == 1
        got = await self.long_poll(
            self.gl.workers.acquire(worker_id, wait, self.who, resync=resync)
        )
        self.reply_or_204(got)


class TaskLogsHandler(GpulayerAPIHandler):
    """``POST tasks/{id}/logs``: a batch of a task's lines."""

    @property
    def max_body_bytes(self) -> int:
        """A batch of long lines may pass the JSON limit."""
        return self.limits.max_batch_bytes

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Store the batch; answer how many lines the task now has."""
        batch = self.parse(LogBatch)
        most = self.limits.max_log_batch_lines
        if len(batch.lines) > most:
            raise PayloadTooLarge(f"a log batch holds at most {most} lines", field="lines")
        self.reply(await self.gl.tasks.append_logs(self.who, task_id, batch))


class TaskEnvironmentHandler(GpulayerAPIHandler):
    """``POST tasks/{id}/environment``: how the task's Python env is doing."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Keep the report (preparing, ready with exact versions, or failed)."""
        env = self.parse(TaskEnvironment)
        self.reply(await self.gl.tasks.set_environment(self.who, task_id, env))


class TaskArtifactHandler(GpulayerAPIHandler):
    """``PUT tasks/{id}/artifacts/{name}``: a file the task wrote."""

    upload = True

    @property
    def max_body_bytes(self) -> int:
        """Artifacts may be large."""
        return self.limits.max_blob_bytes

    @allow_unauthenticated
    @requires("worker")
    async def put(self, task_id: str, name: str) -> None:
        """Store the body as the artifact ``name`` of the task's job."""
        try:
            name = _ARTIFACT_NAME.validate_python(name)
        except pydantic.ValidationError as e:
            why = e.errors()[0]["msg"].removeprefix("Value error, ")
            raise ValidationError(f"artifact name {name!r}: {why}", field="name") from e
        art = await self.gl.tasks.add_artifact(self.who, task_id, name, self.uploaded)
        self.reply(art, 201)


class TaskResultHandler(GpulayerAPIHandler):
    """``PUT tasks/{id}/result``: a function task's outcomes too large to send inline."""

    upload = True

    @property
    def max_body_bytes(self) -> int:
        """Results may be as large as an artifact."""
        return self.limits.max_blob_bytes

    @allow_unauthenticated
    @requires("worker")
    async def put(self, task_id: str) -> None:
        """Keep the body; the completion then names it as ``result_blob``."""
        self.reply(await self.gl.tasks.add_result(self.who, task_id, self.uploaded), 201)


class TaskPartsHandler(GpulayerAPIHandler):
    """``POST tasks/{id}/parts``: outcomes of calls a function task finished."""

    @property
    def max_body_bytes(self) -> int:
        """A batch of outcomes may pass the JSON limit, as a log batch may."""
        return self.limits.max_batch_bytes

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Keep them (a part kept already stays); 204."""
        await self.gl.tasks.add_parts(self.who, task_id, self.parse(ResultPartBatch))
        self.no_content()


class TaskCompleteHandler(GpulayerAPIHandler):
    """``POST tasks/{id}/complete``."""

    @allow_unauthenticated
    @requires("worker")
    async def post(self, task_id: str) -> None:
        """Record the task's end (idempotent)."""
        done = self.parse(TaskCompletion)
        self.reply(await self.gl.tasks.complete(self.who, task_id, done))


class BlobHandler(GpulayerAPIHandler):
    """``GET blobs/{sha256}``: a stored blob (a job's bundle)."""

    @allow_unauthenticated
    @requires("worker")
    async def get(self, sha256: str) -> None:
        """Send the blob's bytes, a chunk at a time (memory bounded by the chunk, however
        slow the worker reads), with its size and sha256 in the headers."""
        size = await self.gl.tasks.blob_size(self.who, sha256)
        self.set_header("X-Gpulayer-Sha256", sha256)
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(size))
        async for chunk in self.gl.blobs.chunks(sha256):
            self.write(chunk)
            await self.flush()
        self.finish()


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"workers/register", RegisterHandler),
    (r"workers/(?P<worker_id>[^/]+)/register", ReregisterHandler),
    (r"workers/(?P<worker_id>[^/]+)/heartbeat", HeartbeatHandler),
    (r"workers/(?P<worker_id>[^/]+)/acquire", AcquireHandler),
    (r"tasks/(?P<task_id>[^/]+)/logs", TaskLogsHandler),
    (r"tasks/(?P<task_id>[^/]+)/artifacts/(?P<name>.+)", TaskArtifactHandler),
    (r"tasks/(?P<task_id>[^/]+)/result", TaskResultHandler),
    (r"tasks/(?P<task_id>[^/]+)/complete", TaskCompleteHandler),
    (r"tasks/(?P<task_id>[^/]+)/parts", TaskPartsHandler),
    (r"tasks/(?P<task_id>[^/]+)/environment", TaskEnvironmentHandler),
    (r"blobs/(?P<sha256>[^/]+)", BlobHandler),
]
