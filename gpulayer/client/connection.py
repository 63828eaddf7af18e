""":class:`Connection`: the sync HTTP client of one gpulayer control plane.

It is the REST protocol of ``docs/api.md`` over one
``httpx.Client``: one method per route, answers parsed into
:mod:`gpulayer.contracts` models, and every failure mapped once (in
``Connection._request``) onto :mod:`gpulayer.errors`:

* the control plane cannot be reached → :class:`~gpulayer.errors.ConnectionFailed`
* an ``ErrorBody`` answer → the class its ``code`` stands for (``NotFound``,
  ``ValidationError`` with ``field``, ``Forbidden``, ...)
* any other unexpected answer → :class:`~gpulayer.errors.ApiError` with method,
  URL and status.

Riding through restarts (docs/user-guide.md, "When the control plane restarts"):
once a connection has had an answer from its control plane, the requests that
waits, log follows and submits make (``retry=True`` below) retry connection errors
and 502/503/504 answers with capped backoff for ``reconnect_seconds`` (default
120 s, ``GPULAYER_RECONNECT_SECONDS``) before they raise. Submits carry an
``Idempotency-Key`` made once per logical submit, so a retry of a submit the
control plane stored before it went away answers the same job (docs/adr/0085).
A connection that never reached its control plane (every connect refused or
timed out) fails at once: a wrong URL says so without a two-minute wait.

The live channel (docs/channel.md): the routes
:data:`gpulayer.contracts.CLIENT_CALLS` lists (submits, waits, log follows, job
reads, cancels) travel over one WebSocket (:mod:`gpulayer.client.channel`), opened
at the first of them with the same token and TLS pin; their answers are the HTTP
route's, mapped by the same code. When the upgrade fails the connection uses
HTTP, and tries the channel again after :data:`CHANNEL_RETRY_SECONDS`;
``channel="http"`` (or ``GPULAYER_CHANNEL=http``) never opens one. A channel that
drops under a call is an outage like any other: a call that may be repeated goes
again (over HTTP at once), so a log follow resumes from its offset.

(:class:`~gpulayer.client.jobs.Job` is the handle users hold;
:mod:`gpulayer.client.default` keeps the process's default connection.)
"""

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from gpulayer import contracts, errors, tls, transfer
from gpulayer.client import artifacts, config, pending
from gpulayer.client.channel import Channel, ChannelClosed, ChannelUnavailable
from gpulayer.client.specs import pydantic_to_gpulayer

log = logging.getLogger(__name__)

#: Longer than the server's 30 s long-poll hold, so a hold never reads as a timeout.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=45.0, write=60.0, pool=5.0)
#: The most a single long-poll asks the server to hold (its cap is 30 s by default).
LONG_POLL_SECONDS = 30.0
#: The header a submit's idempotency key travels in (docs/adr/0085).
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Answers a proxy or a starting control plane gives while it is not there: retried.
_GATEWAY_STATUSES = frozenset({502, 503, 504})
_BACKOFF_FIRST_SECONDS = 0.2
_BACKOFF_MAX_SECONDS = 2.0
#: After a refused or failed upgrade, HTTP only for this long, then the channel again.
CHANNEL_RETRY_SECONDS = 30.0
#: The routes the channel carries, compiled once.
_CHANNEL_ROUTES = [(m, re.compile(p)) for m, p in contracts.CLIENT_CALLS]


@functools.lru_cache(maxsize=256)
def _carried(method: str, path: str) -> bool:
    """Whether the channel carries ``method path`` (a call repeats a few paths)."""
    return any(m == method and p.fullmatch(path) for m, p in _CHANNEL_ROUTES)


_M = TypeVar("_M", bound=BaseModel)


class _ChannelResponse:
    """A channel's answer, read as the HTTP route's response is read: its status,
    body, reason and headers, and the request it answers (an error message names
    it), built only when something reads it: parsing the URL costs ~30 us.

    Not an ``httpx.Response``: building one per answer (its headers, stream and
    decoders, read back at once) cost more than the rest of the client's read of
    the answer.
    """

    __slots__ = ("_asked", "_request", "content", "status_code")

    def __init__(
        self,
        answer: contracts.ChannelAnswer,
        method: str,
        url: str,
        params: Mapping[str, str | int | float] | None,
    ) -> None:
        self.status_code = answer.status
        self.content = answer.body.encode()
        self._asked = (method, url, params)
        self._request: httpx.Request | None = None

    @property
    def text(self) -> str:
        return self.content.decode()

    @property
    def reason_phrase(self) -> str:
        return httpx.codes.get_reason_phrase(self.status_code)

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def headers(self) -> httpx.Headers:
        return httpx.Headers({"Content-Type": "application/json"} if self.content else None)

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def request(self) -> httpx.Request:
        if self._request is None:
            method, url, params = self._asked
            self._request = httpx.Request(method, url, params=params)
        return self._request


#: An answer to one request: over HTTP, or over the channel.
Answer = httpx.Response | _ChannelResponse


class Connection:
    """A connection to one gpulayer control plane.

    Parameters
    ----------
    url
        The Jupyter server URL including its ``base_url``, e.g.
        ``http://127.0.0.1:8765/`` or ``https://lab.example.org/user/ada/``.
        Percent-encoded segments are kept as they are.
    token
        A gpulayer bearer token (``gl_...``).
    timeout
        httpx timeouts; the read timeout must exceed the server's long-poll hold.
    transport
        An httpx transport to use instead of the network (tests use
        ``httpx.MockTransport``).
    fingerprint
        The pinned ``sha256:...`` of the server's certificate (what ``gpulayer
        up`` prints): trust exactly that certificate, not a CA. Without it an
        ``https://`` URL is verified against the CA bundle.
    insecure
        Send the token over ``http://`` to another machine all the same (clear
        text: only on a network you trust). Loopback and ``https://`` need no opt-in.
    reconnect_seconds
        How long waits, log follows and submits keep retrying while the control
        plane cannot be reached (a restart); default ``GPULAYER_RECONNECT_SECONDS``
        or 120. 0 turns it off.
    channel
        ``"auto"`` (default: ``GPULAYER_CHANNEL``, else ``auto``): submits, waits and
        log follows over the live channel (a WebSocket), HTTP when it cannot be
        opened; ``"http"``: HTTP only. A ``transport`` means HTTP only.

    Raises
    ------
    ConfigError
        If ``url`` is not an http(s) URL, a fingerprint comes with ``http://``, or
        ``url`` is ``http://`` to another machine without ``insecure``.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: httpx.Timeout | float | None = None,
        transport: httpx.BaseTransport | None = None,
        fingerprint: str | None = None,
        insecure: bool = False,
        reconnect_seconds: float | None = None,
        channel: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise errors.ConfigError(f"{url!r} is not an http:// or https:// URL")
        if transport is None:  # a transport of the caller's (a test double) is not the network
            tls.refuse_clear_text(url, insecure, "pass insecure=True (--insecure)")
        mode = "http" if transport is not None else channel_mode(channel)
        self.reconnect_seconds = config.reconnect_seconds(reconnect_seconds)
        self._reached = False  # set by the first answer: only then are outages ridden
        verify = tls.verify_for(url, fingerprint)
        self.url = url if url.endswith("/") else url + "/"
        self._api = url.rstrip("/") + contracts.API_PREFIX + "/"
        self._client = httpx.Client(
            timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
            transport=transport,
            verify=tls.for_httpx(verify, url),
            headers={"Authorization": f"Bearer {token}"},
            follow_redirects=False,
        )
        self._token, self._verify = token, verify
        self._channel_mode = mode
        self._channel: Channel | None = None
        self._channel_retry_at = 0.0
        self._channel_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<gpulayer.Connection {self.url}>"

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        """The workers table in a notebook, a one-line status elsewhere."""
        from gpulayer.notebook import render  # IPython only where a display asks for it

        return render.connection_bundle(self, include, exclude)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying HTTP connections and the channel."""
        with self._channel_lock:
            ch, self._channel = self._channel, None
        if ch is not None:
            ch.close()
        self._client.close()

    @property
    def channel_open(self) -> bool:
        """Whether calls travel over an open live channel now (else HTTP)."""
        ch = self._channel
        return ch is not None and not ch.closed

    def websocket_target(self, path: str) -> tuple[str, dict[str, str], ssl.SSLContext | None]:
        """How to open the WebSocket route ``path`` (relative to the API): its
        ``ws(s)://`` URL, the ``Authorization`` header, and the pinned TLS context
        (None: the default checks, or no TLS)."""
        url = "ws" + self._api.removeprefix("http") + path
        context = self._verify if isinstance(self._verify, ssl.SSLContext) else None
        return url, {"Authorization": f"Bearer {self._token}"}, context

    # ----------------------------------------------------------- plumbing

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_model: BaseModel | None = None,
        params: Mapping[str, str | int | float] | None = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        expect: tuple[int, ...] = (200,),
        retry: bool = False,
    ) -> Answer:
        """Send one request and map every failure onto the gpulayer error tree.

        With ``retry`` (a request that may be repeated: a read, a wait, a keyed
        submit), connection errors and 502/503/504 are retried with backoff for
        :attr:`reconnect_seconds` once this connection has reached the control plane.
        """
        url = self._api + path
        sent = dict(headers or {})
        if json_model is not None:
            content = json_model.model_dump_json(exclude_none=True).encode()
            sent["Content-Type"] = "application/json"
        elif content is not None:
            sent.setdefault("Content-Type", "application/octet-stream")
        outage: float | None = None
        delay = _BACKOFF_FIRST_SECONDS
        while True:
            try:
                resp = self._send(method, url, params, content, sent, retry=retry)
            except errors.CertificateMismatch:
                raise
            except errors.ConnectionFailed as e:
                if not isinstance(e.__cause__, httpx.ConnectError | httpx.ConnectTimeout):
                    self._reached = True  # it answered the connect, then went away
                if not (retry and self._reached):
                    raise
                failure: errors.GpulayerError = e
            else:
                self._reached = True
                if resp.status_code in expect:
                    if outage is not None:
                        log.warning("the gpulayer control plane at %s is back", self.url)
                    return resp
                failure = self._error(method, url, resp)
                # A proxy's or a starting server's 502/503/504 passes; a storage
                # error the control plane names (503 read-only disk) is an answer.
                if not (
                    retry
                    and resp.status_code in _GATEWAY_STATUSES
                    and not isinstance(failure, errors.StorageError)
                ):
                    raise failure
            now = time.monotonic()
            if outage is None:
                outage = now
                if self.reconnect_seconds > 0:
                    log.warning(
                        "lost the gpulayer control plane at %s (%s); reconnecting for up to %gs",
                        self.url, failure.message, self.reconnect_seconds,
                    )  # fmt: skip
            left = outage + self.reconnect_seconds - now
            if left <= 0:
                raise _gave_up(failure, now - outage)
            time.sleep(min(delay, left))
            delay = min(delay * 2, _BACKOFF_MAX_SECONDS)

    def _send(
        self,
        method: str,
        url: str,
        params: Mapping[str, str | int | float] | None,
        content: bytes | Iterable[bytes] | None,
        headers: Mapping[str, str],
        *,
        retry: bool = False,
    ) -> Answer:
        """One exchange, over the channel when it carries the route, else HTTP; a
        transport failure is :class:`ConnectionFailed` (or :class:`CertificateMismatch`).

        A channel that drops under a call that may be repeated (``retry``) sends it
        again over HTTP at once; any other such call raises :class:`ConnectionFailed`.
        """
        channel = self._channel_for(method, url, content)
        if channel is not None:
            assert content is None or isinstance(content, bytes)
            try:
                return self._over(channel, method, url, params, content, headers)
            except ChannelClosed as e:
                if not retry:
                    raise errors.ConnectionFailed(
                        f"the channel to {self.url} closed during {method} {url}: {e}",
                        method=method,
                        url=url,
                    ) from e
        try:
            return self._client.request(
                method, url, params=params, content=content, headers=headers
            )
        except httpx.TransportError as e:
            raise self._unreachable(e, method, url) from e

    def _channel_for(
        self, method: str, url: str, content: bytes | Iterable[bytes] | None
    ) -> Channel | None:
        """The open channel when it carries ``method url`` (opened now if need be)."""
        if self._channel_mode == "http" or not (content is None or isinstance(content, bytes)):
            return None
        path = url.removeprefix(self._api)
        if not _carried(method, path):
            return None
        ch = self._channel
        if ch is not None and not ch.closed:
            return ch
        with self._channel_lock:
            if self._channel is not None and not self._channel.closed:
                return self._channel
            if time.monotonic() < self._channel_retry_at:
                return None
            try:
                self._channel = Channel.open(
                    self._api, self._token, tls=self._verify, timeout=self._timeout("connect")
                )
            except ChannelUnavailable as e:
                self._channel = None
                self._channel_retry_at = time.monotonic() + CHANNEL_RETRY_SECONDS
                log.info("gpulayer: no live channel to %s (%s); using HTTP", self.url, e)
            return self._channel

    def _over(
        self,
        channel: Channel,
        method: str,
        url: str,
        params: Mapping[str, str | int | float] | None,
        content: bytes | None,
        headers: Mapping[str, str],
    ) -> Answer:
        """One exchange over the channel, answered as the HTTP route answers."""
        call = contracts.ChannelCall(
            id=0,
            method="GET" if method == "GET" else "POST",
            path=url.removeprefix(self._api),
            query={k: str(v) for k, v in (params or {}).items()},
            idempotency_key=headers.get(IDEMPOTENCY_HEADER),
            body=content.decode() if content else None,
        )
        answer = channel.call(call, self._timeout("read"))
        return _ChannelResponse(answer, method, url, params)

    def _timeout(self, which: str) -> float:
        """The client's ``connect`` or ``read`` timeout in seconds (45 s when unset)."""
        value = getattr(self._client.timeout, which)
        return float(value) if value is not None else 45.0

    @contextlib.contextmanager
    def _streamed(self, method: str, path: str) -> Iterator[httpx.Response]:
        """A 200 answer whose body is read as it arrives (the caller iterates it)."""
        url = self._api + path
        try:
            resp = self._client.send(self._client.build_request(method, url), stream=True)
        except httpx.TransportError as e:
            raise self._unreachable(e, method, url) from e
        try:
            if resp.status_code != 200:
                resp.read()
                raise self._error(method, url, resp)
            yield resp
        except httpx.TransportError as e:
            raise self._unreachable(e, method, url) from e
        finally:
            resp.close()

    def _unreachable(self, e: httpx.TransportError, method: str, url: str) -> errors.ApiError:
        pin = tls.mismatch_in(e)
        if pin is not None:
            return errors.CertificateMismatch(
                tls.mismatch_message(self.url, pin), method=method, url=url
            )
        return errors.ConnectionFailed(
            f"cannot reach the gpulayer control plane at {self.url}: {e or type(e).__name__}",
            method=method,
            url=url,
        )

    @staticmethod
    def _error(method: str, url: str, resp: Answer) -> errors.GpulayerError:
        status = resp.status_code
        try:
            body = contracts.ErrorBody.model_validate_json(resp.content)
        except PydanticValidationError:
            body = None
        if body is not None:
            cls = errors.error_for_code(body.code)
            if cls is not None and not issubclass(cls, errors.ApiError):
                return cls(body.message, field=body.field)
            return errors.ApiError(
                body.message, method=method, url=url, status=status, field=body.field
            )
        text = resp.text.strip().splitlines()[0][:200] if resp.text.strip() else ""
        hint = " (is the gpulayer server extension enabled there?)" if status == 404 else ""
        return errors.ApiError(
            f"{method} {url} answered {status} {resp.reason_phrase}{hint}"
            + (f": {text}" if text else ""),
            method=method,
            url=url,
            status=status,
        )

    def _parse(self, resp: Answer, model: type[_M]) -> _M:
        try:
            return model.model_validate_json(resp.content)
        except PydanticValidationError as e:
            raise errors.ApiError(
                f"the control plane sent a {model.__name__} this client does not understand: "
                f"{pydantic_to_gpulayer(e).message}",
                method=resp.request.method,
                url=str(resp.request.url),
                status=resp.status_code,
            ) from e

    # ------------------------------------------------------------- routes

    def health(self) -> contracts.Health:
        """``GET health``: the control plane is up (and its version)."""
        return self._parse(self._request("GET", "health"), contracts.Health)

    def submit(
        self,
        spec: contracts.JobSpec,
        *,
        wait: float = 0.0,
        idempotency_key: str | None = None,
    ) -> contracts.Job:
        """``POST jobs``: submit a job; answers it as stored (state ``queued``), or,
        with ``wait`` > 0, as it is after up to that many seconds (ended if quick).

        The request carries ``idempotency_key`` (a fresh one when None) and is
        retried with it through an outage, so the job is stored once.
        """
        return self._parse(self._submitted(spec, wait, idempotency_key), contracts.Job)

    def submit_ended(self, spec: contracts.JobSpec, *, wait: float) -> contracts.JobEnd:
        """:meth:`submit` with ``wait``, answered as a :class:`~gpulayer.contracts.JobEnd`
        (``answer=end``): how the job ended and its small result, without its spec and
        tasks (a call's own answer; a control plane that answers the whole ``Job``
        is read the same). Ask for the job itself when it has not ended."""
        return self._parse(self._submitted(spec, wait, None, end=True), contracts.JobEnd)

    def _submitted(
        self,
        spec: contracts.JobSpec,
        wait: float,
        idempotency_key: str | None,
        *,
        end: bool = False,
    ) -> Answer:
        params: dict[str, str] = {}
        if wait > 0:
            params["wait"] = f"{min(wait, LONG_POLL_SECONDS):.3f}"
        if end:
            params["answer"] = "end"
        return self._request(
            "POST", "jobs", json_model=spec, params=params, expect=(201, 200),
            headers=_keyed(idempotency_key), retry=True,
        )  # fmt: skip

    def submit_many(
        self, specs: Sequence[contracts.JobSpec], *, idempotency_key: str | None = None
    ) -> list[contracts.Job]:
        """``POST jobs/batch``: several jobs in one request, all stored or none; one
        idempotency key for the batch, as for :meth:`submit`."""
        body = contracts.JobBatch(jobs=list(specs))
        resp = self._request(
            "POST", "jobs/batch", json_model=body, expect=(201, 200),
            headers=_keyed(idempotency_key), retry=True,
        )  # fmt: skip
        return self._parse(resp, contracts.JobList).jobs

    def wait_any(self, job_ids: Sequence[str], timeout: float) -> list[contracts.Job]:
        """``POST jobs/wait``: the jobs among ``job_ids`` that ended, as soon as one
        has (with small function results), or ``[]`` after ``timeout`` s."""
        body = contracts.WaitAny(ids=list(job_ids), timeout=min(timeout, LONG_POLL_SECONDS))
        resp = self._request("POST", "jobs/wait", json_model=body, expect=(200, 204), retry=True)
        return [] if resp.status_code == 204 else self._parse(resp, contracts.JobList).jobs

    def result(self, job_id: str) -> bytes:
        """``GET jobs/{id}/result``: a function job's pickled outcomes (read after a
        wait, so it rides through an outage as the wait does)."""
        return self._request("GET", f"jobs/{_seg(job_id)}/result", retry=True).content

    def result_parts(self, job_id: str) -> contracts.ResultPartList:
        """``GET jobs/{id}/parts``: outcomes of a function job's calls kept apart from
        its result (calls an attempt finished before its worker died; docs/adr/0096)."""
        resp = self._request("GET", f"jobs/{_seg(job_id)}/parts", retry=True)
        return self._parse(resp, contracts.ResultPartList)

    def jobs(self, state: str | None = None, limit: int = 100) -> list[contracts.Job]:
        """``GET jobs``: the newest jobs, optionally only those in ``state``."""
        params: dict[str, str | int | float] = {"limit": limit}
        if state is not None:
            params["state"] = str(state)
        resp = self._request("GET", "jobs", params=params)
        return self._parse(resp, contracts.JobList).jobs

    def job(self, job_id: str, *, retry: bool = False) -> contracts.Job:
        """``GET jobs/{id}``: one job with its tasks and pending reasons (``retry``:
        ride through an outage, as waits do)."""
        resp = self._request("GET", f"jobs/{_seg(job_id)}", retry=retry)
        return self._parse(resp, contracts.Job)

    def wait(self, job_id: str, timeout: float | None = None) -> contracts.Job:
        """Block until the job ends, by long-polling ``GET jobs/{id}/wait``.

        Parameters
        ----------
        timeout
            Seconds to wait at most; None waits for as long as it takes.

        Raises
        ------
        TimeoutError
            If the job has not ended within ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            hold = LONG_POLL_SECONDS
            if deadline is not None:
                hold = min(hold, deadline - time.monotonic())
                if hold <= 0:
                    break
            resp = self._request(
                "GET",
                f"jobs/{_seg(job_id)}/wait",
                params={"timeout": f"{hold:.3f}"},
                expect=(200, 204),
                retry=True,
            )
            if resp.status_code == 200:
                return self._parse(resp, contracts.Job)
        # The deadline passed between two holds: one last look before giving up.
        job = self.job(job_id, retry=True)
        if job.state.terminal:
            return job
        why = pending.why_queued(job) or f"it is {job.state}"
        raise TimeoutError(f"job {job_id} did not end within {timeout:g}s ({why})")

    def cancel(self, job_id: str, *, retry: bool = False) -> contracts.Job:
        """``POST jobs/{id}/cancel``; raises ``InvalidTransition`` once it has ended
        (``retry``: through an outage; a repeated cancel may then find it ended)."""
        resp = self._request("POST", f"jobs/{_seg(job_id)}/cancel", retry=retry)
        return self._parse(resp, contracts.Job)

    def delete_job(self, job_id: str) -> None:
        """``DELETE jobs/{id}``: delete a finished job with its logs, metrics and
        artifacts; raises ``Conflict`` while it is queued or running."""
        self._request("DELETE", f"jobs/{_seg(job_id)}", expect=(204,))

    def gc(self, req: contracts.GcRequest | None = None) -> contracts.GcReport:
        """``POST gc`` (admin): apply the retention policy now (``req``'s limits instead
        of the configured ones, when given) and delete blobs no job names."""
        body = req if req is not None else contracts.GcRequest()
        return self._parse(self._request("POST", "gc", json_model=body), contracts.GcReport)

    def interrupt(self, job_id: str) -> contracts.Job:
        """``POST jobs/{id}/interrupt``: SIGINT a cell's kernel (one not started is cancelled)."""
        resp = self._request("POST", f"jobs/{_seg(job_id)}/interrupt")
        return self._parse(resp, contracts.Job)

    def sessions(self) -> list[contracts.Session]:
        """``GET sessions``: the sessions that have not ended."""
        return self._parse(self._request("GET", "sessions"), contracts.SessionList).sessions

    def session(self, name: str) -> contracts.Session:
        """``GET sessions/{name}``; raises ``NotFound`` once it ended."""
        return self._parse(self._request("GET", f"sessions/{_seg(name)}"), contracts.Session)

    def create_session(self, req: contracts.CreateSession) -> contracts.Session:
        """``POST sessions``: start a persistent kernel; ``Conflict`` if the name is taken."""
        resp = self._request("POST", "sessions", json_model=req, expect=(201,))
        return self._parse(resp, contracts.Session)

    def end_session(self, name: str) -> None:
        """``DELETE sessions/{name}``: stop its kernel and free its slot and GPUs."""
        self._request("DELETE", f"sessions/{_seg(name)}", expect=(204,))

    def events(self, job_id: str) -> list[contracts.Event]:
        """``GET jobs/{id}/events``: the job's state changes, oldest first."""
        resp = self._request("GET", f"jobs/{_seg(job_id)}/events")
        return self._parse(resp, contracts.EventList).events

    def logs(
        self,
        job_id: str,
        offset: int = 0,
        wait: float = 0,
        limit: int | None = None,
        *,
        retry: bool = False,
        attempt: int | None = None,
    ) -> contracts.LogPage:
        """``GET jobs/{id}/logs``: lines from ``offset``; with ``wait`` a long poll
        (``retry``: ride through an outage, as follows do); with ``attempt`` only
        that attempt's lines (offsets stay the job's)."""
        params: dict[str, str | int | float] = {"offset": offset}
        if wait:
            params["wait"] = wait
        if limit is not None:
            params["limit"] = limit
        if attempt is not None:
            params["attempt"] = attempt
        resp = self._request(
            "GET", f"jobs/{_seg(job_id)}/logs", params=params, expect=(200, 204), retry=retry
        )
        if resp.status_code == 204:  # the hold ran out: nothing new yet
            return contracts.LogPage(lines=[], next_offset=offset, complete=False)
        return self._parse(resp, contracts.LogPage)

    def training_metrics(
        self, job_id: str, after: int = 0, wait: float = 0, limit: int | None = None
    ) -> contracts.MetricPage:
        """``GET jobs/{id}/metrics``: training metric points after ``after``; with
        ``wait`` a long poll for the next ones. (Not the control plane's Prometheus
        exposition at ``gpulayer/metrics``.)"""
        params: dict[str, str | int | float] = {"after": after}
        if wait:
            params["wait"] = wait
        if limit is not None:
            params["limit"] = limit
        resp = self._request("GET", f"jobs/{_seg(job_id)}/metrics", params=params)
        return self._parse(resp, contracts.MetricPage)

    #: The name this method had before issue 14 (kept so existing code still runs).
    metrics = training_metrics

    def follow_logs(
        self, job_id: str, offset: int = 0, *, attempt: int | None = None
    ) -> Iterator[contracts.LogLine]:
        """Yield the job's log lines from ``offset`` (only attempt ``attempt``'s when
        given) as they arrive, each once.

        Ends once the job has ended and every line has been yielded. Rides through
        a control-plane restart: it goes on from the next offset, so no line is
        yielded twice or skipped.
        """
        wait = LONG_POLL_SECONDS
        while True:
            page = self.logs(job_id, offset, wait=wait, retry=True, attempt=attempt)
            for line in page.lines:
                if line.offset >= offset:  # a page that overlaps the last one
                    offset = line.offset + 1
                    yield line
            offset = max(offset, page.next_offset)
            if page.complete and not page.lines:
                return
            # A complete page may still be one of several: drain without holding.
            wait = 0 if page.complete else LONG_POLL_SECONDS

    def artifacts(self, job_id: str) -> list[contracts.Artifact]:
        """``GET jobs/{id}/artifacts``: the files the job's tasks kept."""
        resp = self._request("GET", f"jobs/{_seg(job_id)}/artifacts")
        return self._parse(resp, contracts.ArtifactList).artifacts

    def download_artifact(self, job_id: str, name: str) -> bytes:
        """``GET jobs/{id}/artifacts/{name}``: the artifact's bytes (in memory; see
        :meth:`download_artifact_to` for large files)."""
        path = f"jobs/{_seg(job_id)}/artifacts/{quote(name, safe='/')}"
        resp = self._request("GET", path)
        announced = resp.headers.get(transfer.SHA256_HEADER)
        if announced is not None:
            got = hashlib.sha256(resp.content).hexdigest()
            transfer.Digest(announced, len(resp.content)).check(
                got, len(resp.content), f"artifact {name!r}"
            )
        return resp.content

    def download_artifact_to(
        self,
        job_id: str,
        name: str,
        dest: str | os.PathLike[str],
        *,
        expected: transfer.Digest | None = None,
        progress: transfer.Progress | None = None,
    ) -> transfer.Digest:
        """``GET jobs/{id}/artifacts/{name}`` streamed into the file ``dest``, a chunk at
        a time; the file appears only whole and with the artifact's sha256.

        Raises
        ------
        TransferError
            If what arrived is not the artifact (``expected``, else the sha256 the
            control plane announced); ``dest`` is then left as it was.
        """
        path = f"jobs/{_seg(job_id)}/artifacts/{quote(name, safe='/')}"
        with self._streamed("GET", path) as resp:
            if expected is None and (announced := resp.headers.get(transfer.SHA256_HEADER)):
                length = resp.headers.get("Content-Length")
                if length is not None and length.isdigit():
                    expected = transfer.Digest(announced, int(length))
            return transfer.receive(
                resp.iter_bytes(transfer.CHUNK_BYTES),
                dest,
                expected=expected,
                progress=progress,
                what=f"artifact {name!r} of job {job_id}",
            )

    def download(
        self,
        job_id: str,
        dest_dir: str | os.PathLike[str],
        names: Sequence[str] | None = None,
        *,
        progress: transfer.Progress | None = None,
    ) -> list[Path]:
        """Download the job's artifacts (or only ``names``) below ``dest_dir``, each
        streamed, checked against its sha256 and written atomically.

        Returns
        -------
        list of Path
            The files written, in artifact order.

        Raises
        ------
        NotFound
            If one of ``names`` is not an artifact of the job.
        ValidationError
            If an artifact name would land outside ``dest_dir``.
        TransferError
            If an artifact arrived corrupt (that file is not written).
        """
        return artifacts.download(self, job_id, dest_dir, names, progress=progress)

    def upload_blob(self, data: bytes) -> contracts.BlobRef:
        """``POST blobs``: store raw bytes (a payload) by sha256 (retried through an
        outage: storing the same bytes twice stores them once)."""
        digest = transfer.Digest(hashlib.sha256(data).hexdigest(), len(data))
        resp = self._request(
            "POST",
            "blobs",
            content=data,
            headers=digest.headers(),
            expect=(201, 200),
            retry=True,
        )
        return self._stored(resp, digest, "upload")

    def upload_file(
        self,
        path: str | os.PathLike[str],
        digest: transfer.Digest,
        *,
        progress: transfer.Progress | None = None,
    ) -> contracts.BlobRef:
        """``POST blobs`` with a file's bytes (a packed workdir), streamed a chunk at a
        time; ``digest`` is the file's content, which the answer must confirm.

        Raises
        ------
        TransferError
            If the control plane stored other content than ``digest``.
        """
        chunks = transfer.file_chunks(path, total=digest.size, progress=progress)
        resp = self._request(
            "POST", "blobs", content=chunks, headers=digest.headers(), expect=(201, 200)
        )
        return self._stored(resp, digest, f"upload of {os.fspath(path)}")

    def _stored(self, resp: Answer, digest: transfer.Digest, what: str) -> contracts.BlobRef:
        ref = self._parse(resp, contracts.BlobRef)
        digest.check(ref.sha256, ref.size, what)
        return ref

    def placement(self, job_id: str) -> contracts.Placement:
        """``GET jobs/{id}/placement``: where the job runs, or per worker why it waits."""
        resp = self._request("GET", f"jobs/{_seg(job_id)}/placement")
        return self._parse(resp, contracts.Placement)

    def drain(self, worker: str, *, resume: bool = False) -> contracts.Worker:
        """``POST workers/{name}/drain`` (or ``resume``): stop giving the worker new tasks."""
        action = "resume" if resume else "drain"
        resp = self._request("POST", f"workers/{_seg(worker)}/{action}")
        return self._parse(resp, contracts.Worker)

    def forget_worker(self, worker: str) -> None:
        """``DELETE workers/{name}`` (admin): revoke the worker's tokens, end its tasks
        ``lost`` and free its name for a join token (a reinstalled machine)."""
        self._request("DELETE", f"workers/{_seg(worker)}", expect=(204,))

    def telemetry(self, worker: str) -> contracts.Telemetry:
        """``GET workers/{name}/telemetry``: the worker's recent readings."""
        resp = self._request("GET", f"workers/{_seg(worker)}/telemetry")
        return self._parse(resp, contracts.Telemetry)

    def create_token(self, req: contracts.CreateToken) -> contracts.CreatedToken:
        """``POST tokens`` (admin): a new token; its secret is in the answer only."""
        resp = self._request("POST", "tokens", json_model=req, expect=(201,))
        return self._parse(resp, contracts.CreatedToken)

    def tokens(self) -> list[contracts.Token]:
        """``GET tokens`` (admin): every token's record, never a secret."""
        return self._parse(self._request("GET", "tokens"), contracts.TokenList).tokens

    def revoke_token(self, name: str) -> None:
        """``DELETE tokens/{name}`` (admin): revoke every active token with this name."""
        self._request("DELETE", f"tokens/{_seg(name)}", expect=(204,))

    def workers(self) -> list[contracts.Worker]:
        """``GET workers``: every known worker with its devices and state."""
        return self._parse(self._request("GET", "workers"), contracts.WorkerList).workers

    def set_secret(self, name: str, value: str) -> contracts.Secret:
        """``PUT secrets/{name}``: store your secret ``name`` (a new value replaces the
        old one for tasks that start from now on); the answer never holds the value."""
        try:
            req = contracts.SetSecret.model_validate({"value": value})
        except PydanticValidationError as e:  # the value is never in the message
            raise pydantic_to_gpulayer(e) from None
        resp = self._request("PUT", f"secrets/{_seg(name)}", json_model=req, expect=(200, 201))
        return self._parse(resp, contracts.Secret)

    def secrets(self) -> list[contracts.Secret]:
        """``GET secrets``: the secrets you may name (an admin: every owner's), never values."""
        return self._parse(self._request("GET", "secrets"), contracts.SecretList).secrets

    def delete_secret(self, name: str, owner: str | None = None) -> None:
        """``DELETE secrets/{name}``: forget your secret (an admin: ``owner``'s)."""
        params = {"owner": owner} if owner else None
        self._request("DELETE", f"secrets/{_seg(name)}", params=params, expect=(204,))

    def share_secret(
        self, name: str, with_owner: str, owner: str | None = None, *, share: bool = True
    ) -> None:
        """``PUT``/``DELETE secrets/{name}/shares/{with_owner}`` (admin): let
        ``with_owner``'s jobs name the secret (your own, or ``owner``'s), or stop that."""
        path = f"secrets/{_seg(name)}/shares/{_seg(with_owner)}"
        params = {"owner": owner} if owner else None
        if share:
            self._request("PUT", path, params=params)
        else:
            self._request("DELETE", path, params=params, expect=(204,))

    def providers(self) -> list[contracts.Provider]:
        """``GET providers``: the configured providers with their offers and limits."""
        return self._parse(self._request("GET", "providers"), contracts.ProviderList).providers

    def instances(self) -> list[contracts.Instance]:
        """``GET instances``: active provider instances, then recent ended ones, with cost."""
        return self._parse(self._request("GET", "instances"), contracts.InstanceList).instances

    def terminate_instance(self, instance_id: str) -> contracts.Instance:
        """``POST instances/{id}/terminate`` (admin): end a provider instance now."""
        resp = self._request("POST", f"instances/{_seg(instance_id)}/terminate")
        return self._parse(resp, contracts.Instance)


def channel_mode(value: str | None = None) -> str:
    """Whether to open the live channel: ``value``, else ``$GPULAYER_CHANNEL``, else
    ``auto`` (``http``: never).

    Raises
    ------
    ConfigError
        For another value.
    """
    env = contracts.CHANNEL_ENV
    raw = value if value is not None else os.environ.get(env, "").strip() or "auto"
    mode = raw.lower()
    if mode not in contracts.CHANNEL_MODES:
        where = "channel" if value is not None else env
        modes = ", ".join(contracts.CHANNEL_MODES)
        raise errors.ConfigError(f"{where} must be one of {modes}, not {raw!r}")
    return mode


def new_idempotency_key() -> str:
    """A fresh key for one logical submit (random, so never reused by accident)."""
    return "gl-" + os.urandom(16).hex()  # a uuid4's length, without building a UUID


def _keyed(key: str | None) -> dict[str, str]:
    return {IDEMPOTENCY_HEADER: key if key is not None else new_idempotency_key()}


def _gave_up(failure: errors.GpulayerError, seconds: float) -> errors.GpulayerError:
    """``failure`` after retrying for ``seconds``: the same class, saying so."""
    if seconds <= 0:
        return failure
    failure.message = f"{failure.message} (still failing after {seconds:.0f}s of retrying)"
    failure.args = (failure.message,)
    return failure


def _seg(value: str) -> str:
    """One URL path segment (ids never contain ``/``; quote anyway)."""
    return quote(str(value), safe="")
