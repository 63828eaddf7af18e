"""The base of every gpulayer route, and the state the app publishes to handlers.

Handlers only translate: parse the request into a contract model, call a service
of the :class:`~jupyter_ext.control_plane.ControlPlane` with the request's
principal, write the answer model. The base class owns authentication (bearer
token or Jupyter identity, see ``auth.py``), body limits, parsing, the error map
(``errors.py``), and the cancellation of long polls when the client goes away.

Bodies are streamed (tornado's ``stream_request_body``): ``prepare`` runs when the
headers have arrived, before any body byte is read, and refuses a request that has
no principal, has the wrong role or declares a body over the route's limit; only
then is the body read, into memory up to ``max_body_bytes`` for JSON routes, or
into a :class:`~jupyter_ext.artifacts.BlobUpload` (a temporary file, hashed as it
arrives) for the routes that take a blob (``upload = True``). docs/adr/0076.
"""

import asyncio
import logging
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pydantic
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from prometheus_client import CollectorRegistry
from tornado import web

from gpulayer.errors import (
    AuthError,
    GpulayerError,
    PayloadTooLarge,
    RateLimited,
    StorageError,
    ValidationError,
    storage_error,
)

from ..artifacts import BlobUpload
from ..auth import Principal, admit, bearer_token
from ..control_plane import ControlPlane
from ..prometheus import StateCollector
from .bodies import decode_json, integer_arg, number_arg
from .errors import error_body, status_of

AUTH_RESOURCE = "gpulayer"
STARTUP_WAIT_SECONDS = 30.0
#: A refused request's body up to this size is read (and dropped) before the answer.
DRAIN_BYTES = 1024 * 1024
M = TypeVar("M", bound=pydantic.BaseModel)
T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """The ``GpulayerApp`` settings handlers read (a snapshot at start-up)."""

    long_poll_seconds: float = 30.0
    max_body_bytes: int = 8 * 1024 * 1024
    max_blob_bytes: int = 512 * 1024 * 1024
    max_log_batch_lines: int = 5000
    jupyter_user_role: str = "admin"
    max_batch_bytes: int = 32 * 1024 * 1024
    max_heartbeat_devices: int = 64
    max_heartbeat_tasks: int = 256
    #: The live channel (docs/channel.md): keepalive ping period, calls in flight.
    channel_ping_seconds: float = 15.0
    channel_max_calls: int = 64
    channel_max_unsent_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class Running:
    """What a started control plane offers handlers."""

    plane: ControlPlane
    registry: CollectorRegistry
    gauges: StateCollector


@dataclass
class AppState:
    """What handlers reach through ``self.settings["gpulayer"]``."""

    limits: Limits
    running: Running | None = None
    #: Set once the start hook has opened the store; requests that arrive earlier wait.
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: The owner of every Jupyter login the server knows no name for (set at start).
    anonymous_owner: str = "jupyter"
    #: The control plane's log. The handlers' ``self.log`` (jupyter_server's extension
    #: mixin) is ``settings["gpulayer"].log``: this, under either host.
    log: logging.Logger | logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.getLogger("gpulayer")
    )


#: jupyter_server's own identity providers: they check a shared token or password,
#: know no people, and give every login a random "Anonymous" user.
_NAMELESS_PROVIDERS = (IdentityProvider, PasswordIdentityProvider)


def jupyter_owner(provider: object, username: str, anonymous_owner: str) -> str:
    """Whose jobs a Jupyter user's requests are: its name when the server's identity
    provider knows people (JupyterHub's, or any other subclass), else
    ``anonymous_owner``, one owner for every token or password login of this server
    (a random name per connection would split one person's jobs)."""
    return anonymous_owner if type(provider) in _NAMELESS_PROVIDERS else username


_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Header with which an uploader announces the sha256 of what it sends.
SHA256_HEADER = "X-Gpulayer-Sha256"


@web.stream_request_body
class GpulayerAPIHandler(ExtensionHandlerMixin, APIHandler):
    """Base of every gpulayer route."""

    auth_resource = AUTH_RESOURCE
    principal: Principal | None = None
    #: True for routes whose body is a blob (streamed to a file, not held in memory).
    upload = False
    _wait_task: asyncio.Task[Any] | None = None
    _buffer: bytearray | None = None
    _upload: BlobUpload | None = None

    @property
    def state(self) -> AppState:
        """The app's published state."""
        state = self.settings["gpulayer"]
        assert isinstance(state, AppState)
        return state

    @property
    def running(self) -> Running:
        """The started control plane (503 while there is none)."""
        running = self.state.running
        if running is None:
            raise web.HTTPError(503, "gpulayer is not running")
        return running

    @property
    def gl(self) -> ControlPlane:
        """The control plane's services."""
        return self.running.plane

    @property
    def limits(self) -> Limits:
        """The app's limits and timings."""
        return self.state.limits

    @property
    def who(self) -> Principal:
        """The request's principal (``requires`` has made sure there is one)."""
        if self.principal is None:
            raise AuthError("this route needs a gpulayer token or a logged-in Jupyter user")
        return self.principal

    @property
    def max_body_bytes(self) -> int:
        """Largest request body this route takes."""
        return self.limits.max_body_bytes

    async def prepare(self) -> None:  # type: ignore[override]  # jupyter_server's prepare may return an awaitable or None
        """Resolve the principal before Jupyter's checks (a bearer token skips XSRF),
        then refuse, before the body is read, what the verb would refuse anyway.

        A refused request whose declared body is small (at most
        :data:`DRAIN_BYTES`) is answered once its body has been read and dropped,
        so the client reads the answer rather than a reset connection; a larger
        one is answered at once and its connection closed unread.
        """
        state = self.state
        if not state.ready.is_set():
            try:
                await asyncio.wait_for(state.ready.wait(), STARTUP_WAIT_SECONDS)
            except TimeoutError as e:
                raise web.HTTPError(503, "gpulayer is still starting") from e
        declared = self._declared_length()
        try:
            await self._authenticate()
            self._admit()
            if declared is not None and declared > self.max_body_bytes:
                raise PayloadTooLarge(
                    f"request body is {declared} bytes; this route takes at most"
                    f" {self.max_body_bytes}"
                )
            expected = self._announced_sha256()
        except (GpulayerError, web.HTTPError) as e:
            if declared is not None and declared > DRAIN_BYTES:
                raise
            self._refuse_after_body(e)
            return
        self._expect_body(expected)

    async def _authenticate(self) -> None:
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
            name = jupyter_owner(self.identity_provider, user.username, self.state.anonymous_owner)
            self.principal = Principal(name=name, role=self.limits.jupyter_user_role)

    def _admit(self) -> None:
        """The verb's role check (``requires``), now rather than after the body."""
        verb = getattr(self, (self.request.method or "").lower(), None)
        allowed = getattr(verb, "__gpulayer_roles__", None)
        if allowed is not None:
            admit(self.principal, allowed, self.request.method or "", self.request.path)

    def _declared_length(self) -> int | None:
        length = self.request.headers.get("Content-Length")
        if length is None:
            return None
        if not length.strip().isdigit():
            raise ValidationError("Content-Length must be a number of bytes")
        return int(length)

    def _refuse_after_body(self, error: Exception) -> None:
        """Answer ``error`` once the (small) body has arrived and been dropped: the
        verb tornado calls then is one that raises it."""

        async def refuse(*args: Any, **kwargs: Any) -> None:
            raise error

        self._set_body_limit(DRAIN_BYTES)
        setattr(self, (self.request.method or "get").lower(), refuse)

    def _set_body_limit(self, most: int) -> None:
        if self.request.connection is not None:
            # Bodies without a Content-Length (chunked) are cut off at the limit too.
            self.request.connection.set_max_body_size(most)  # type: ignore[attr-defined]  # HTTP1Connection's

    def _announced_sha256(self) -> str | None:
        expected = self.request.headers.get(SHA256_HEADER) if self.upload else None
        if expected is not None and not _SHA256.fullmatch(expected):
            raise ValidationError(f"{SHA256_HEADER} must be a sha256 hex digest", field="sha256")
        return expected

    def _expect_body(self, expected_sha256: str | None) -> None:
        """Get ready to receive the body: into memory, or into a blob upload."""
        most = self.max_body_bytes
        self._set_body_limit(most)
        if self.upload:
            self._upload = self.gl.blobs.upload(most, expected_sha256)
        else:
            self._buffer = bytearray()

    async def data_received(self, chunk: bytes) -> None:
        """A piece of the body: to the upload's file, or to memory (bounded by the
        limit ``prepare`` set on the connection)."""
        if self._finished:
            return
        if self._upload is not None:
            await self._upload.write(chunk)
        elif self._buffer is not None:
            if len(self._buffer) + len(chunk) > self.max_body_bytes:
                raise PayloadTooLarge(f"request body is over {self.max_body_bytes} bytes")
            self._buffer += chunk

    @property
    def body(self) -> bytes:
        """The request body of a JSON route (empty for none)."""
        return bytes(self._buffer or b"")

    @property
    def uploaded(self) -> BlobUpload:
        """The blob a route with ``upload = True`` received (the service commits it)."""
        if self._upload is None:
            raise ValidationError("this request carries no upload")
        return self._upload

    def on_finish(self) -> None:
        """Drop an upload that was not committed (refused, failed)."""
        if self._upload is not None:
            self._upload.discard()
        super().on_finish()

    def _action(self) -> str:
        return "read" if self.request.method in ("GET", "HEAD") else "write"

    def check_xsrf_cookie(self) -> None:
        """Requests with a valid gpulayer bearer token carry no cookie to forge, and a
        request Jupyter did not authenticate has no session to forge (it gets 401)."""
        if self.principal is not None and self.principal.token_id is not None:
            return None
        if getattr(self, "_jupyter_current_user", "unset") is None:
            return None
        super().check_xsrf_cookie()
        return None

    # ---------------------------------------------------------- parsing

    def parse(self, model: type[M]) -> M:
        """The JSON body as ``model``, or a 400 naming the bad field (``bodies.py``)."""
        return decode_json(self.body, model)

    def float_arg(self, name: str, default: float, hi: float) -> float:
        """A numeric query argument in ``[0, hi]``."""
        return number_arg(self.get_query_argument(name, None), name, default, hi)

    def int_arg(self, name: str, default: int, lo: int, hi: int) -> int:
        """An integer query argument in ``[lo, hi]``."""
        return integer_arg(self.get_query_argument(name, None), name, default, lo, hi)

    def wait_arg(self, name: str = "wait", default: float = 0.0) -> float:
        """A long-poll hold from the query, at most ``long_poll_seconds``."""
        return self.float_arg(name, default, self.limits.long_poll_seconds)

    # ---------------------------------------------------------- answers

    def reply(self, model: pydantic.BaseModel, status: int = 200) -> None:
        """Write ``model`` as the JSON answer."""
        self.set_status(status)
        self.finish(model.model_dump_json())

    def reply_or_204(self, model: pydantic.BaseModel | None) -> None:
        """:meth:`reply` with ``model``, or 204 when a long poll's hold ran out."""
        if model is None:
            self.no_content()
        else:
            self.reply(model)

    def created(self, model: pydantic.BaseModel, name: str) -> None:
        """201 with ``model`` and its ``Location`` (this path plus ``name``)."""
        self.set_header("Location", self.request.path.rstrip("/") + "/" + name)
        self.reply(model, 201)

    def no_content(self) -> None:
        """Answer 204 (a long poll's hold ran out, a delete)."""
        self.set_status(204)
        self.finish()

    def send_bytes(self, data: bytes) -> None:
        """Answer raw bytes."""
        self.finish(data, set_content_type="application/octet-stream")

    # ------------------------------------------------------- long polls

    async def long_poll(self, work: Awaitable[T]) -> T | None:
        """Run a wait that ends early if the client disconnects, and with 401 the
        moment the request's token is revoked or expires."""
        task: asyncio.Task[T] = asyncio.ensure_future(self._unless_revoked(work))
        self._wait_task = task
        try:
            return await task
        except asyncio.CancelledError:
            if self.request.connection is None or task.cancelled():
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
        """Stop waiting for a client that went away; drop its unfinished upload."""
        if self._wait_task is not None:
            self._wait_task.cancel()
        if self._upload is not None:
            self._upload.discard()
        super().on_connection_close()

    # ----------------------------------------------------------- errors

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, OSError) and (storage := storage_error(e, e.filename or "data_dir")):
            e = storage.with_traceback(e.__traceback__)  # a full or read-only disk: 507/503
        if isinstance(e, StorageError):  # the operator's problem: say so in the server log
            self.log.warning("%s %s refused: %s", self.request.method, self.request.path, e)
        if isinstance(e, GpulayerError):
            if self._finished:
                return
            self.send_error(status_of(e), exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error is an ``ErrorBody``; no tracebacks leave the server."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        body = error_body(exc, status_code, self._reason)
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="gpulayer"')
        if isinstance(exc, RateLimited):
            self.set_header("Retry-After", str(max(1, round(exc.retry_after_seconds))))
        self.set_header("Content-Type", "application/json")
        self.finish(body.model_dump_json())
