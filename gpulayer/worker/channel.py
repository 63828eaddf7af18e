"""The worker's live channel: one outbound WebSocket to the control plane
(docs/channel.md, docs/adr/0111).

Over it the control plane pushes the worker's ``Acquired`` (assignments, cancels,
interrupts) the moment placement stores them, and the worker sends its log
batches and completions (:data:`gpulayer.contracts.WORKER_CALLS`) as
:class:`~gpulayer.contracts.ChannelCall` frames answered as the HTTP routes
answer them; heartbeats, registrations, uploads and bundle downloads stay HTTP.
The worker still only calls out. The agent's acquire loop runs
:meth:`WorkerChannel.serve` and falls back to HTTP long polls when the upgrade
is refused (a proxy that blocks WebSockets) or ``--channel http`` says so.
Library: ``websockets``' asyncio client.
"""

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable
from typing import Annotated

import pydantic
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from gpulayer import contracts as c
from gpulayer.contracts.channel import Method
from gpulayer.sockets import nodelay

log = logging.getLogger(__name__)

#: The largest frame taken from the control plane (an ``Acquired`` with inline payloads).
MAX_FRAME_BYTES = 64 * 1024 * 1024
#: Keepalive: a ping this often; no pong within as long closes the channel.
PING_SECONDS = 20.0
OPEN_TIMEOUT_SECONDS = 10.0

_Incoming = pydantic.TypeAdapter(
    Annotated[c.ChannelPush | c.ChannelAnswer, pydantic.Field(discriminator="type")],
    config=c.DEFERRED,
)


class ChannelRefused(Exception):
    """The control plane answered the handshake without upgrading it."""

    def __init__(self, status: int) -> None:
        super().__init__(f"upgrade refused (HTTP {status})")
        self.status = status


class ChannelUnavailable(Exception):
    """The channel could not be opened (no answer, a reset, a TLS failure)."""


class ChannelClosed(Exception):
    """The channel closed before a call's answer came (the call may have run)."""


def ws_url(url: str, worker_id: str) -> str:
    """The worker channel's ``ws(s)://`` URL from the control plane's root URL."""
    root = "ws" + url.removeprefix("http").rstrip("/") + c.API_PREFIX + "/"
    return root + c.WORKER_CHANNEL_PATH.format(worker_id=worker_id)


async def _connect(target: str, tls: ssl.SSLContext | bool, token: str) -> ClientConnection:
    """Open a WebSocket to the control plane with the worker's token (pinned TLS for
    ``wss://``; small frames out at once).

    Raises
    ------
    ChannelRefused
        When the handshake is answered without an upgrade (its status).
    ChannelUnavailable
        When it cannot be opened at all.
    """
    context = tls if isinstance(tls, ssl.SSLContext) else None
    try:
        ws = await connect(
            target,
            additional_headers={"Authorization": f"Bearer {token}"},
            ssl=context if target.startswith("wss://") else None,
            open_timeout=OPEN_TIMEOUT_SECONDS,
            max_size=MAX_FRAME_BYTES,
            ping_interval=PING_SECONDS,
            ping_timeout=PING_SECONDS,
            compression=None,
        )
    except InvalidStatus as e:
        raise ChannelRefused(e.response.status_code) from e
    except (OSError, InvalidHandshake, TimeoutError) as e:
        raise ChannelUnavailable(f"{type(e).__name__}: {e}") from e
    nodelay(ws)
    return ws


async def open_kernel_relay(
    url: str, tls: ssl.SSLContext | bool, worker_id: str, token: str, job_id: str
) -> ClientConnection:
    """The worker's end of a gpulayer kernel's relay (docs/kernels.md): a WebSocket
    of its own per kernel, binary frames both ways.

    Raises
    ------
    ChannelRefused
        When the control plane answers without upgrading (404: the kernel's task is
        not running here any more).
    ChannelUnavailable
        When it cannot be opened at all.
    """
    root = "ws" + url.removeprefix("http").rstrip("/") + c.API_PREFIX + "/"
    target = root + c.WORKER_KERNEL_CHANNEL_PATH.format(worker_id=worker_id, job_id=job_id)
    return await _connect(target, tls, token)


class WorkerChannel:
    """The worker's channel; one :meth:`serve` at a time, :meth:`call` from any task.

    Parameters
    ----------
    url
        The control plane's root URL (``http(s)://``, base_url included).
    tls
        The pinned context (``gpulayer.tls.verify_for``), or True for CA checks.
    """

    def __init__(self, url: str, tls: ssl.SSLContext | bool) -> None:
        self._url = url
        self._tls = tls
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[c.ChannelAnswer]] = {}

    @property
    def is_open(self) -> bool:
        """Whether calls may go over the channel now."""
        return self._ws is not None

    async def serve(self, worker_id: str, token: str, on_push: Callable[[c.Acquired], None]) -> str:
        """Open the channel and hand each pushed ``Acquired`` to ``on_push`` until it
        closes; returns why it closed.

        Raises
        ------
        ChannelRefused
            When the handshake is answered without an upgrade (its status: 401 or
            404 mean register again, others a proxy or an older control plane).
        ChannelUnavailable
            When it cannot be opened at all.
        """
        ws = await _connect(ws_url(self._url, worker_id), self._tls, token)
        self._ws = ws
        try:
            return await self._read(ws, on_push)
        finally:
            self._ws = None
            waiting, self._pending = list(self._pending.values()), {}
            for fut in waiting:
                if not fut.done():
                    fut.set_exception(ChannelClosed("the channel closed"))
            await ws.close()

    async def _read(self, ws: ClientConnection, on_push: Callable[[c.Acquired], None]) -> str:
        try:
            async for message in ws:
                try:
                    frame = _Incoming.validate_json(message)
                except pydantic.ValidationError:
                    log.warning("ignored a channel frame this worker does not understand")
                    continue
                if isinstance(frame, c.ChannelPush):
                    on_push(frame.acquired)
                elif (fut := self._pending.pop(frame.id, None)) is not None and not fut.done():
                    fut.set_result(frame)
        except ConnectionClosed as e:
            return str(e)
        return f"closed by the control plane ({ws.close_code} {ws.close_reason or ''})".strip()

    async def call(
        self, method: Method, path: str, body: pydantic.BaseModel | None
    ) -> c.ChannelAnswer:
        """Send one call and wait for its answer.

        Raises
        ------
        ChannelClosed
            If the channel is not open or closes before the answer.
        """
        ws = self._ws
        if ws is None:
            raise ChannelClosed("the channel is not open")
        call = c.ChannelCall(
            id=next(self._ids),
            method=method,
            path=path,
            body=None if body is None else body.model_dump_json(),
        )
        fut: asyncio.Future[c.ChannelAnswer] = asyncio.get_running_loop().create_future()
        self._pending[call.id] = fut
        try:
            await ws.send(call.model_dump_json(exclude_defaults=True))
            return await fut
        except ConnectionClosed as e:
            raise ChannelClosed(str(e)) from e
        finally:
            self._pending.pop(call.id, None)
