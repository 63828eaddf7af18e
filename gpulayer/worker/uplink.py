"""The worker's link to the control plane: HTTP, retries, re-registration, bundles.

The agent only ever calls out (docs/api.md, "Worker protocol"). The control plane
may restart at any time: every request retries transport errors, 5xx answers and
429 (too many requests) with capped exponential backoff, forever, waiting at least
what a ``Retry-After`` header asks (up to :data:`RETRY_AFTER_CAP_SECONDS`), so a
finished task's logs and completion wait in memory until the server takes them
and running tasks carry on meanwhile. A 401 (or a 404 on a
``workers/{id}`` route) means the server forgot this worker: :class:`Uplink`
registers again under the same name, listing its running tasks, and carries on.
Registering again takes the worker's own credential
(:mod:`~gpulayer.worker.credential`); the join token registers only a new name.
"""

import asyncio
import email.utils
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypedDict, Unpack

import httpx
import pydantic

from gpulayer import contracts as c
from gpulayer import tls, transfer
from gpulayer.errors import (
    CertificateMismatch,
    GpulayerError,
    NotFound,
    TransferError,
    ValidationError,
    error_for_code,
)
from gpulayer.private import private_dir
from gpulayer.worker.channel import ChannelClosed, WorkerChannel
from gpulayer.worker.credential import Credential, CredentialFile

log = logging.getLogger(__name__)

BACKOFF_START_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 2.0
#: The longest ``Retry-After`` honoured (a lease outlives it; a longer ask is capped).
RETRY_AFTER_CAP_SECONDS = 30.0

Content = bytes | Callable[[], AsyncIterator[bytes]]
#: Answers to a registration with the worker's own credential that mean it is no
#: longer good here: unknown or revoked, another worker's, or no such worker.
_CREDENTIAL_REFUSED = frozenset({401, 403, 404, 409})
#: The routes the live channel carries, compiled once.
_CHANNEL_ROUTES = [(m, re.compile(p)) for m, p in c.WORKER_CALLS]


class Request(TypedDict, total=False):
    """The optional parts of a request (:meth:`Uplink.call`)."""

    body: pydantic.BaseModel | None
    params: dict[str, int] | None
    content: Content | None
    headers: dict[str, str] | None
    retry: bool
    stream: bool


class Uplink:
    """Requests to the control plane as this worker.

    Parameters
    ----------
    http
        The client every request goes through.
    url
        The Jupyter server root URL, base_url included.
    join_token
        What registration exchanges for the worker's own id and token.
    name
        The worker's name (for log lines).
    registration
        Describes the worker at each registration (its running tasks change).
    on_registered
        Called with every answer to a registration and the seconds the request that
        got it took (the registration was taken in no earlier than that long ago).
    blob_dir
        Where downloaded bundles are cached by their sha256.
    credentials
        Where the worker keeps the credential it registers again with (None: in
        memory only).
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        url: str,
        join_token: str,
        *,
        name: str,
        registration: Callable[[], c.WorkerRegistration],
        on_registered: Callable[[c.Registered, float], None],
        blob_dir: Path,
        credentials: CredentialFile | None = None,
    ) -> None:
        self._http = http
        self._url = url
        self._base = url.rstrip("/") + c.API_PREFIX + "/"
        self._join_token = join_token
        self._name = name
        self._registration = registration
        self._on_registered = on_registered
        self._blob_dir = blob_dir
        self._blob_locks: dict[str, asyncio.Lock] = {}
        self._worker_id = ""
        self._worker_token = ""
        self._registrations = 0  # bumped by every successful registration
        self._register_lock = asyncio.Lock()
        self._outage_since: float | None = None
        self._credentials = credentials
        self._credential = credentials.load(url) if credentials is not None else None
        #: The live channel, while the agent keeps one (its log batches and completions).
        self.channel: WorkerChannel | None = None

    @property
    def worker_id(self) -> str:
        """The id of the latest registration ("" before the first)."""
        return self._worker_id

    @property
    def worker_token(self) -> str:
        """The worker's own token from the latest registration."""
        return self._worker_token

    @property
    def join_token(self) -> str:
        """What registers a new name (set late by a worker that ``gpulayer up`` hands
        it to once its control plane is up)."""
        return self._join_token

    @join_token.setter
    def join_token(self, token: str) -> None:
        self._join_token = token

    # ---------------------------------------------------------- registration

    async def register(self) -> None:
        """Register: again with the worker's own credential when it has one for this
        control plane, else (or when that is refused) as a new worker with the join
        token; the answer's id and token are kept (and the credential saved).

        Raises
        ------
        GpulayerError
            If the control plane rejects the registration (e.g. a bad join token, or
            a name that is registered already).
        """
        body = self._registration()
        resp = await self._register_as_itself(body)
        if resp is None:
            resp = await self._send("POST", "workers/register", token=self._join_token, body=body)
        if not resp.is_success:
            raise error_for(resp, "registration rejected")
        reg = c.Registered.model_validate(resp.json())
        self._worker_id, self._worker_token = reg.worker_id, reg.token
        self._registrations += 1
        log.info(
            "registered worker %s as %s (%d GPUs)", self._name, reg.worker_id, len(body.devices)
        )
        await self._keep_credential(Credential(self._url, reg.worker_id, reg.token))
        self._on_registered(reg, resp.elapsed.total_seconds())

    async def register_again(self) -> None:
        """Register again now (retrying until the control plane takes it)."""
        await self._register_again(self._registrations)

    async def _register_as_itself(self, body: c.WorkerRegistration) -> httpx.Response | None:
        """``workers/{id}/register`` with the kept credential; None when there is none
        or the control plane refuses it (it forgot or evicted this worker: the
        credential is dropped, and the join token tried, now and from now on)."""
        cred = self._credential
        if cred is None:
            return None
        path = f"workers/{cred.worker_id}/register"
        resp = await self._send("POST", path, token=cred.token, body=body)
        if resp.status_code in _CREDENTIAL_REFUSED:
            log.warning(
                "worker %s: its credential was refused (%s); registering with the join token",
                self._name,
                describe(resp),
            )
            self._credential = None
            return None
        return resp

    async def _keep_credential(self, cred: Credential) -> None:
        if cred == self._credential:
            return
        self._credential = cred
        if self._credentials is not None:
            await asyncio.to_thread(self._credentials.save, cred)

    async def _register_again(self, seen: int) -> None:
        """Register again unless someone already did since registration ``seen``."""
        async with self._register_lock:
            delay, warned = BACKOFF_START_SECONDS, False
            while self._registrations == seen:
                try:
                    await self.register()
                except GpulayerError as e:
                    if not warned:
                        log.error("worker %s cannot register again (%s); retrying", self._name, e)
                        warned = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, BACKOFF_CAP_SECONDS)

    # ---------------------------------------------------------------- HTTP

    async def call(
        self, method: str, route: str, *, worker_route: bool = False, **kw: Unpack[Request]
    ) -> httpx.Response:
        """A request with the worker token; registers again when the server forgot us.

        ``worker_route`` routes are relative to ``workers/{worker_id}/``, resolved at
        every try because a new registration may bring a new id.
        """
        delay = 0.0
        while True:
            seen = self._registrations
            path = f"workers/{self._worker_id}/{route}" if worker_route else route
            resp = await self._over_channel(method, path, kw)
            if resp is None:
                resp = await self._send(method, path, token=self._worker_token, **kw)
            if resp.status_code != 401 and not (worker_route and resp.status_code == 404):
                return resp
            log.warning(
                "control plane does not know worker %s (HTTP %d); registering again",
                self._name,
                resp.status_code,
            )
            await asyncio.sleep(delay)  # only a server that keeps forgetting us waits here
            delay = min(max(delay * 2, BACKOFF_START_SECONDS), BACKOFF_CAP_SECONDS)
            await self._register_again(seen)

    async def _over_channel(self, method: str, path: str, kw: Request) -> httpx.Response | None:
        """The answer over the live channel when it is open and carries the route;
        None to use HTTP (not carried, closed under the call, or a 5xx or 429 that
        HTTP's retries wait out)."""
        channel = self.channel
        if (
            channel is None
            or not channel.is_open
            or kw.get("content") is not None
            or kw.get("params")
            or not any(m == method and p.fullmatch(path) for m, p in _CHANNEL_ROUTES)
        ):
            return None
        try:
            answer = await channel.call("POST", path, kw.get("body"))
        except ChannelClosed:
            return None  # over HTTP, at once: logs are deduplicated, completions idempotent
        if answer.status >= 500 or answer.status == 429:
            return None
        # The request (a URL parsed: most of this answer's cost) only where an error
        # message may name it; the worker reads a success's status and body only.
        request = None if answer.status < 400 else httpx.Request(method, self._base + path)
        return httpx.Response(answer.status, content=answer.body.encode(), request=request)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        token: str,
        body: pydantic.BaseModel | None = None,
        params: dict[str, int] | None = None,
        content: Content | None = None,
        headers: dict[str, str] | None = None,
        retry: bool = True,
        stream: bool = False,
    ) -> httpx.Response:
        """One request; with ``retry``, transport errors and 5xx answers are retried
        with capped backoff until they stop, warning once per outage. With ``stream``
        a successful answer's body is left to read (``aiter_bytes``, then ``aclose``);
        any other answer is read whole."""
        all_headers = {"Authorization": f"Bearer {token}", **(headers or {})}
        delay, warned = BACKOFF_START_SECONDS, False
        while True:
            asked = 0.0
            try:
                request = self._http.build_request(
                    method,
                    self._base + path,
                    params=params,
                    headers=all_headers,
                    json=None if body is None else body.model_dump(mode="json"),
                    content=content() if callable(content) else content,
                )
                resp = await self._http.send(request, stream=stream)
                if stream and not resp.is_success:
                    await resp.aread()  # an error's body, and the connection back
            except httpx.TransportError as e:
                pin = tls.mismatch_in(e)
                if pin is not None:  # not an outage: never retried, nothing was sent
                    raise CertificateMismatch(tls.mismatch_message(self._url, pin)) from e
                if not retry:
                    raise
                problem = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 500 and resp.status_code != 429:
                    if self._outage_since is not None:
                        outage = asyncio.get_running_loop().time() - self._outage_since
                        log.info("control plane is back after %.1fs", outage)
                        self._outage_since = None
                    return resp
                if not retry:
                    return resp
                problem = describe(resp)  # e.g. "HTTP 507 storage_full: the disk is full (...)"
                asked = retry_after(resp)
            if not warned and self._outage_since is None:
                log.warning("control plane unavailable (%s); retrying until it is back", problem)
                self._outage_since = asyncio.get_running_loop().time()
            warned = True
            await asyncio.sleep(max(delay, asked))
            delay = min(delay * 2, BACKOFF_CAP_SECONDS)

    # --------------------------------------------------------------- blobs

    async def blob(self, sha256: str) -> bytes:
        """A payload or pushed variables by its sha256 (small), from the cache or the
        server; see :meth:`blob_file`."""
        return await asyncio.to_thread((await self.blob_file(sha256)).read_bytes)

    async def blob_file(self, sha256: str) -> Path:
        """A blob (a bundle) by its sha256 in the worker's cache, downloaded once: a
        chunk at a time into a file that appears only whole and with that sha256
        (:func:`gpulayer.transfer.areceive`), so memory stays bounded by the chunk.

        Raises
        ------
        NotFound, ValidationError
            If the control plane does not have it, or sends something else.
        """
        path = self._blob_dir / sha256
        async with self._blob_locks.setdefault(sha256, asyncio.Lock()):
            if path.is_file():
                return path
            await asyncio.to_thread(private_dir, path.parent)  # the cache is the worker's only
            resp = await self.call("GET", f"blobs/{sha256}", stream=True)
            try:
                if resp.status_code == 404:
                    raise NotFound(f"bundle {sha256} is not on the control plane", field="bundle")
                if not resp.is_success:
                    raise error_for(resp, f"cannot download bundle {sha256}")
                length = resp.headers.get("Content-Length", "")
                expected = transfer.Digest(sha256, int(length)) if length.isdigit() else None
                await transfer.areceive(
                    resp.aiter_bytes(transfer.CHUNK_BYTES),
                    path,
                    expected=expected,
                    what=f"bundle {sha256}",
                )
            except (TransferError, httpx.TransportError) as e:
                raise ValidationError(f"bundle {sha256} arrived corrupt", field="bundle") from e
            finally:
                await resp.aclose()
            if (
                expected is None
                and (await asyncio.to_thread(transfer.digest_file, path)).sha256 != sha256
            ):
                path.unlink(missing_ok=True)
                raise ValidationError(f"bundle {sha256} arrived corrupt", field="bundle")
            return path


def retry_after(resp: httpx.Response) -> float:
    """Seconds a ``Retry-After`` header asks to wait (seconds or an HTTP date), at
    most :data:`RETRY_AFTER_CAP_SECONDS`; 0 without a readable one."""
    value = resp.headers.get("Retry-After", "").strip()
    if not value:
        return 0.0
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_SECONDS)


def describe(resp: httpx.Response) -> str:
    """``HTTP 413 too_large: message`` from an error answer, tolerant of odd bodies."""
    try:
        err = c.ErrorBody.model_validate(resp.json())
    except ValueError:  # not JSON, or not an ErrorBody (pydantic errors are ValueErrors)
        return f"HTTP {resp.status_code}"
    return f"HTTP {resp.status_code} {err.code}: {err.message}"


def error_for(resp: httpx.Response, what: str) -> GpulayerError:
    """The domain error an error answer stands for."""
    try:
        body = c.ErrorBody.model_validate(resp.json())
    except ValueError:
        return GpulayerError(f"{what}: HTTP {resp.status_code}")
    cls = error_for_code(body.code) or GpulayerError
    return cls(f"{what}: {body.message}", field=body.field)
