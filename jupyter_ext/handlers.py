"""User-facing REST handlers under ``/gpulayer/api/v1/``, and their base class.

Handlers only translate: parse the request into a contract model, call the
:class:`~jupyter_ext.scheduler.Scheduler`, write the answer model. The base class
owns authentication (bearer token or Jupyter identity, see ``auth.py``), body
limits, parsing, the one table that maps domain errors to HTTP statuses, and the
cancellation of long polls when the client goes away.
"""

import asyncio
import json
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import quote

import pydantic
from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from gpulayer import __version__
from gpulayer.contracts import (
    TERMINAL_STATES,
    ArtifactList,
    BlobRef,
    CreateSession,
    ErrorBody,
    EventList,
    Health,
    JobBatch,
    JobList,
    JobSpec,
    JobState,
    SessionList,
    WaitAny,
    WorkerList,
)
from gpulayer.errors import (
    AuthError,
    Conflict,
    Forbidden,
    GpulayerError,
    InvalidTransition,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ValidationError,
)

from .auth import Principal, bearer_token, requires

AUTH_RESOURCE = "gpulayer"
STARTUP_WAIT_SECONDS = 30.0
M = TypeVar("M", bound=pydantic.BaseModel)
T = TypeVar("T")

#: The one place domain errors become HTTP statuses (the client maps back by ``code``).
STATUS: dict[type[GpulayerError], int] = {
    ValidationError: 400,
    AuthError: 401,
    Forbidden: 403,
    RateLimited: 429,
    NotFound: 404,
    Conflict: 409,
    InvalidTransition: 409,
    PayloadTooLarge: 413,
}
_CODE_BY_STATUS = {
    400: "invalid",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    429: "rate_limited",
}


def _status_of(err: GpulayerError) -> int:
    for cls in type(err).__mro__:
        if cls in STATUS:
            return STATUS[cls]  # type: ignore[index]
    return 500


def validation_error(e: pydantic.ValidationError, prefix: str = "") -> ValidationError:
    """A pydantic error as one message naming every offending field."""
    parts, first = [], None
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        loc = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "body"
        first = first or loc
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field '{loc}'")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}")
    return ValidationError("; ".join(parts), field=first)


class GpulayerAPIHandler(ExtensionHandlerMixin, APIHandler):
    """Base of every gpulayer route."""

    auth_resource = AUTH_RESOURCE
    principal: Principal | None = None
    _wait_task: asyncio.Task[Any] | None = None

    @property
    def gl(self) -> Any:
        """The extension's services (see ``app.Services``)."""
        services = self.settings["gpulayer"]
        if services.scheduler is None:
            raise web.HTTPError(503, "gpulayer is not running")
        return services

    @property
    def max_body_bytes(self) -> int:
        """Largest request body this route takes."""
        return self.settings["gpulayer"].config.max_body_bytes

    async def prepare(self) -> None:  # type: ignore[override]
        """Resolve the principal before Jupyter's checks (a bearer token skips XSRF)."""
        length = self.request.headers.get("Content-Length")
        body_len = int(length) if length and length.isdigit() else len(self.request.body or b"")
        if body_len > self.max_body_bytes:
            raise PayloadTooLarge(
                f"request body is {body_len} bytes; this route takes at most {self.max_body_bytes}"
            )
        services = self.settings["gpulayer"]
        if not services.ready.is_set():
            try:
                await asyncio.wait_for(services.ready.wait(), STARTUP_WAIT_SECONDS)
            except TimeoutError as e:
                raise web.HTTPError(503, "gpulayer is still starting") from e
        token = bearer_token(self.request.headers.get("Authorization"))
        if token is not None:
            self.principal = await self.gl.tokens.resolve(token, self.request.remote_ip)
        await super().prepare()
        user = self.current_user
        # The Jupyter user (Lab, a hub cookie, Jupyter's own token) gets the configured role.
        if (
            self.principal is None
            and user is not None
            and self.authorizer.is_authorized(self, user, self._action(), AUTH_RESOURCE)
        ):
            self.principal = Principal(name=user.username, role=self.gl.config.jupyter_user_role)

    def _action(self) -> str:
        return "read" if self.request.method in ("GET", "HEAD") else "write"

    def check_xsrf_cookie(self) -> None:
        """Requests with a valid gpulayer bearer token carry no cookie to forge, and a
        request Jupyter did not authenticate has no session to forge (it gets 401)."""
        if self.principal is not None and self.principal.token_id is not None:
            return None
        if getattr(self, "_jupyter_current_user", "unset") is None:
            return None
        return super().check_xsrf_cookie()

    def own_only(self) -> str | None:
        """The owner a submitter is limited to (None: every owner's)."""
        p = self.principal
        return p.name if p is not None and p.role == "submitter" else None

    async def own_sessions(self, specs: list[JobSpec]) -> None:
        """Refuse a submitter cells in another owner's session, as if it did not exist."""
        owner = self.own_only()
        for name in {s.in_session for s in specs if s.in_session and owner is not None}:
            await self.gl.scheduler.sessions.find(name, owner)

    async def visible_job(self, job_id: str) -> None:
        """Refuse a submitter another owner's job, as if it did not exist (404)."""
        p = self.principal
        if p is not None and p.role == "submitter":
            row = await self.gl.store.get_job(job_id)
            if row is None or row["owner"] != p.name:
                raise NotFound(f"no job with id {job_id!r}")

    # ---------------------------------------------------------- parsing

    def parse(self, model: type[M]) -> M:
        """The JSON body as ``model``, or a 400 naming the bad field."""
        try:
            data = json.loads(self.request.body or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValidationError(f"request body is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValidationError("request body must be a JSON object")
        try:
            return model.model_validate(data)
        except pydantic.ValidationError as e:
            raise validation_error(e) from e

    def float_arg(self, name: str, default: float, hi: float) -> float:
        """A numeric query argument in ``[0, hi]``."""
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError as e:
            raise ValidationError(f"query argument {name!r} must be a number", field=name) from e
        if not 0 <= value <= 1e9:
            raise ValidationError(f"query argument {name!r} must be >= 0", field=name)
        return min(value, hi)

    def int_arg(self, name: str, default: int, lo: int, hi: int) -> int:
        """An integer query argument in ``[lo, hi]``."""
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError as e:
            raise ValidationError(f"query argument {name!r} must be an integer", field=name) from e
        if not lo <= value <= hi:
            raise ValidationError(f"query argument {name!r} must be in [{lo}, {hi}]", field=name)
        return value

    def reply(self, model: pydantic.BaseModel, status: int = 200) -> None:
        """Write ``model`` as the JSON answer."""
        self.set_status(status)
        self.finish(model.model_dump_json())

    def no_content(self) -> None:
        """Answer 204 (a long poll's hold ran out, a delete)."""
        self.set_status(204)
        self.finish()

    async def long_poll(self, work: Awaitable[T]) -> T | None:
        """Run a wait that ends early if the client disconnects, and with 401 the
        moment the request's token is revoked or expires."""
        self._wait_task = asyncio.ensure_future(self._unless_revoked(work))
        try:
            return await self._wait_task
        except asyncio.CancelledError:
            if self.request.connection is None or self._wait_task.cancelled():
                return None
            raise
        finally:
            self._wait_task = None

    async def _unless_revoked(self, work: Awaitable[T]) -> T:
        job = asyncio.ensure_future(work)
        if self.principal is None or self.principal.token_id is None:
            return await job
        guard = asyncio.ensure_future(self.gl.tokens.until_invalid(self.principal))
        try:
            await asyncio.wait({job, guard}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (job, guard):
                if not t.done():
                    t.cancel()
        if job.done() and not job.cancelled():
            return job.result()
        raise AuthError(guard.result())

    def on_connection_close(self) -> None:
        """Stop waiting for a client that went away."""
        if self._wait_task is not None:
            self._wait_task.cancel()
        super().on_connection_close()

    # ----------------------------------------------------------- errors

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, GpulayerError):
            if self._finished:
                return
            self.send_error(_status_of(e), exc_info=sys.exc_info())
            return
        super()._handle_request_exception(e)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error is an ``ErrorBody``; no tracebacks leave the server."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, GpulayerError):
            body = ErrorBody(code=exc.code, message=exc.message, field=exc.field)
        elif isinstance(exc, web.HTTPError):
            body = ErrorBody(
                code=_CODE_BY_STATUS.get(status_code, "error"),
                message=exc.log_message or exc.reason or self._reason,
            )
        else:
            body = ErrorBody(code="internal", message="internal error; see the server log")
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="gpulayer"')
        if isinstance(exc, RateLimited):
            self.set_header("Retry-After", str(max(1, round(exc.retry_after_seconds))))
        self.set_header("Content-Type", "application/json")
        self.finish(body.model_dump_json())


class HealthHandler(GpulayerAPIHandler):
    """``GET health``: is the control plane up (no token needed)."""

    @allow_unauthenticated
    async def get(self) -> None:
        """Answer ``Health``."""
        sched = self.gl.scheduler
        workers = [w for w in await sched.workers() if w.state == "ready"]
        active = await sched.store.count_jobs(["queued", "scheduled", "running"])
        self.reply(Health(version=__version__, workers_ready=len(workers), jobs_active=active))


class JobsHandler(GpulayerAPIHandler):
    """``POST jobs`` submits; ``GET jobs`` lists."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """List jobs, newest first (``state``, ``owner``, ``limit``)."""
        state = self.get_query_argument("state", None)
        try:
            st = JobState(state) if state else None
        except ValueError as e:
            raise ValidationError(
                f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}",
                field="state",
            ) from e
        limit = self.int_arg("limit", 100, 1, 10000)
        p = self.principal
        # A submitter sees only its own jobs, whatever ``owner`` it asks for.
        owner = (
            p.name
            if p is not None and p.role == "submitter"
            else self.get_query_argument("owner", None)
        )
        self.reply(JobList(jobs=await self.gl.scheduler.list_jobs(st, limit, owner)))

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Submit a ``JobSpec``; 201 with the job and its ``Location``. With ``wait=S``
        the answer waits up to S seconds for the job to end (a quick function call
        then costs one request)."""
        spec = self.parse(JobSpec)
        hold = self.float_arg("wait", 0.0, self.gl.config.long_poll_seconds)
        assert self.principal is not None
        await self.own_sessions([spec])
        job = await self.gl.scheduler.submit(spec, owner=self.principal.name)
        self.set_header("Location", self.request.path.rstrip("/") + "/" + job.id)
        if hold > 0 and job.state not in TERMINAL_STATES:
            job = await self.long_poll(self.gl.scheduler.wait(job.id, hold)) or job
        self.reply(job, 201)


class JobBatchHandler(GpulayerAPIHandler):
    """``POST jobs/batch``: several jobs in one request."""

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Submit every spec of a ``JobBatch`` (all or none); 201 with the jobs."""
        batch = self.parse(JobBatch)
        assert self.principal is not None
        await self.own_sessions(batch.jobs)
        jobs = await self.gl.scheduler.submit_many(batch.jobs, owner=self.principal.name)
        self.reply(JobList(jobs=jobs), 201)


class JobsWaitHandler(GpulayerAPIHandler):
    """``POST jobs/wait``: long poll until any of several jobs ends."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def post(self) -> None:
        """200 with the jobs that ended (small results included), or 204."""
        req = self.parse(WaitAny)
        p = self.principal
        if p is not None and p.role == "submitter":
            rows = await self.gl.store.jobs_by_ids(req.ids)
            theirs = {r["id"] for r in rows if r["owner"] == p.name}
            if missing := [i for i in req.ids if i not in theirs]:
                raise NotFound(f"no job with id {missing[0]!r}", field="ids")
        timeout = min(req.timeout, self.gl.config.long_poll_seconds)
        jobs = await self.long_poll(self.gl.scheduler.wait_any(req.ids, timeout))
        if jobs is None:
            self.no_content()
        else:
            self.reply(JobList(jobs=jobs))


class JobResultHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/result``: a function job's pickled outcomes."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """The result bytes (unpickle them only if you trust the job's code)."""
        await self.visible_job(job_id)
        data = await self.gl.scheduler.result(job_id)
        self.finish(data, set_content_type="application/octet-stream")


class JobHandler(GpulayerAPIHandler):
    """``GET jobs/{id}``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """One job with tasks and pending reasons."""
        await self.visible_job(job_id)
        self.reply(await self.gl.scheduler.get_job(job_id))


class JobWaitHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/wait?timeout=S``: long poll until the job ends."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """200 with the ended job, or 204 when the hold ran out."""
        await self.visible_job(job_id)
        hold = self.gl.config.long_poll_seconds
        timeout = self.float_arg("timeout", hold, hold)
        job = await self.long_poll(self.gl.scheduler.wait(job_id, timeout))
        if job is None:
            self.no_content()
        else:
            self.reply(job)


class JobCancelHandler(GpulayerAPIHandler):
    """``POST jobs/{id}/cancel``."""

    @allow_unauthenticated
    @requires("submitter")
    async def post(self, job_id: str) -> None:
        """Cancel; 409 when the job already ended."""
        await self.visible_job(job_id)
        assert self.principal is not None
        self.reply(await self.gl.scheduler.cancel(job_id, by=self.principal.name))


class JobInterruptHandler(GpulayerAPIHandler):
    """``POST jobs/{id}/interrupt``: SIGINT a cell's kernel (the notebook's stop button)."""

    @allow_unauthenticated
    @requires("submitter")
    async def post(self, job_id: str) -> None:
        """Interrupt; a cell not started yet is cancelled, 409 once it ended."""
        await self.visible_job(job_id)
        assert self.principal is not None
        self.reply(await self.gl.scheduler.interrupt(job_id, by=self.principal.name))


class SessionsHandler(GpulayerAPIHandler):
    """``GET sessions`` lists; ``POST sessions`` starts one."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """The sessions that have not ended (a submitter's own)."""
        sessions = await self.gl.scheduler.list_sessions(self.own_only())
        self.reply(SessionList(sessions=sessions))

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Start a ``CreateSession``; 201 with the session, 409 when the name is taken."""
        req = self.parse(CreateSession)
        assert self.principal is not None
        session = await self.gl.scheduler.create_session(req, owner=self.principal.name)
        self.set_header("Location", self.request.path.rstrip("/") + "/" + quote(session.name))
        self.reply(session, 201)


class SessionHandler(GpulayerAPIHandler):
    """``GET sessions/{name}``; ``DELETE sessions/{name}`` ends it."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, name: str) -> None:
        """One session that has not ended."""
        self.reply(await self.gl.scheduler.get_session(name, self.own_only()))

    @allow_unauthenticated
    @requires("submitter")
    async def delete(self, name: str) -> None:
        """End the session: its kernel stops, its slot and GPUs are freed; 204."""
        assert self.principal is not None
        await self.gl.scheduler.end_session(name, self.principal.name, self.own_only())
        self.no_content()


class JobEventsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/events``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """Every state change, oldest first."""
        await self.visible_job(job_id)
        self.reply(EventList(events=await self.gl.scheduler.events(job_id)))


class JobLogsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/logs?offset=&limit=&wait=``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """Lines from ``offset``; with ``wait`` a long poll for the next ones."""
        await self.visible_job(job_id)
        offset = self.int_arg("offset", 0, 0, 2**62)
        limit = self.int_arg("limit", 1000, 1, 10000)
        wait = self.float_arg("wait", 0.0, self.gl.config.long_poll_seconds)
        page = await self.long_poll(self.gl.scheduler.logs(job_id, offset, limit, wait))
        if page is not None:
            self.reply(page)


class JobArtifactsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/artifacts``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """The job's artifacts."""
        await self.visible_job(job_id)
        self.reply(ArtifactList(artifacts=await self.gl.scheduler.artifacts(job_id)))


class JobArtifactHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/artifacts/{name}``: the file's bytes."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str, name: str) -> None:
        """Send the artifact as a download."""
        await self.visible_job(job_id)
        art = await self.gl.scheduler.artifact(job_id, name)
        data = await self.gl.blobs.read(art.sha256)
        self.set_header(
            "Content-Disposition", f"attachment; filename*=UTF-8''{quote(name.rsplit('/', 1)[-1])}"
        )
        self.set_header("X-Gpulayer-Sha256", art.sha256)
        self.finish(data, set_content_type="application/octet-stream")


class BlobsHandler(GpulayerAPIHandler):
    """``POST blobs``: upload bytes (a source bundle); answers its sha256."""

    @property
    def max_body_bytes(self) -> int:
        """Blobs may be as large as an artifact."""
        return self.settings["gpulayer"].config.max_blob_bytes

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Store the body by content."""
        sha, size = await self.gl.blobs.put(self.request.body)
        self.set_header("Location", self.request.path.rstrip("/") + "/" + sha)
        self.reply(BlobRef(sha256=sha, size=size), 201)


class WorkersHandler(GpulayerAPIHandler):
    """``GET workers``."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """Every worker with its state and running tasks."""
        self.reply(WorkerList(workers=await self.gl.scheduler.workers()))


class JobPlacementHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/placement``: where it runs, or per worker why it waits."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, job_id: str) -> None:
        """Answer ``Placement``."""
        await self.visible_job(job_id)
        self.reply(await self.gl.scheduler.placement(job_id))


class WorkerDrainHandler(GpulayerAPIHandler):
    """``POST workers/{name}/drain`` and ``workers/{name}/resume``."""

    @allow_unauthenticated
    @requires("admin")
    async def post(self, name: str, action: str) -> None:
        """Drain (finish running tasks, take no new ones) or resume a worker."""
        self.reply(await self.gl.scheduler.drain(name, draining=action == "drain"))


class WorkerTelemetryHandler(GpulayerAPIHandler):
    """``GET workers/{name}/telemetry``: the recent heartbeat readings."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, name: str) -> None:
        """Answer ``Telemetry``."""
        self.reply(await self.gl.scheduler.telemetry(name))


_ID = r"(?P<{}>[^/]+)"
JOB = _ID.format("job_id")

#: Route table (paths relative to the API prefix).
ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"health", HealthHandler),
    (r"jobs", JobsHandler),
    (r"jobs/batch", JobBatchHandler),
    (r"jobs/wait", JobsWaitHandler),
    (rf"jobs/{JOB}", JobHandler),
    (rf"jobs/{JOB}/result", JobResultHandler),
    (rf"jobs/{JOB}/wait", JobWaitHandler),
    (rf"jobs/{JOB}/cancel", JobCancelHandler),
    (rf"jobs/{JOB}/interrupt", JobInterruptHandler),
    (r"sessions", SessionsHandler),
    (r"sessions/(?P<name>[^/]+)", SessionHandler),
    (rf"jobs/{JOB}/events", JobEventsHandler),
    (rf"jobs/{JOB}/logs", JobLogsHandler),
    (rf"jobs/{JOB}/artifacts", JobArtifactsHandler),
    (rf"jobs/{JOB}/artifacts/(?P<name>.+)", JobArtifactHandler),
    (r"blobs", BlobsHandler),
    (r"workers", WorkersHandler),
    (rf"jobs/{JOB}/placement", JobPlacementHandler),
    (r"workers/(?!register$)(?P<name>[^/]+)/(?P<action>drain|resume)", WorkerDrainHandler),
    (r"workers/(?P<name>[^/]+)/telemetry", WorkerTelemetryHandler),
]
