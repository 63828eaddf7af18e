"""The live channel: a WebSocket per client (``channel``) and per worker
(``workers/{id}/channel``), docs/channel.md and docs/adr/0111.

The handshake is an ordinary GET that ``prepare`` authenticates before tornado
upgrades it: a bearer token (no cookie: a browser page cannot open it for a
user), the route's roles, and for a worker its own id; a refusal is the JSON
``ErrorBody`` with 401/403/404/429, as on every other route, and no upgrade.

Once open, the peer sends :class:`~gpulayer.contracts.ChannelCall` frames, each
answered (in any order, calls run side by side) by a
:class:`~gpulayer.contracts.ChannelAnswer` from ``channel_calls.py``. A worker's
channel also pushes a :class:`~gpulayer.contracts.ChannelPush` with its
``Acquired`` the moment placement stores an assignment (or a cancel or interrupt
waits for it): the acquire long poll, held open for as long as the socket is; a
submit that starts its task at once sends it itself (``Core.pushers``, docs/adr/0160).

Limits: a frame over the route's body limit closes the channel (1009) and
harms nothing else; at most ``channel_max_calls`` calls in flight (more are
answered 429); unsent answers past ``channel_max_unsent_bytes`` close it with
``CLOSE_RESYNC`` (the peer reconnects and resumes from its offsets), so a peer
that stops reading cannot grow the server's memory. A close frame waits behind
what the peer has not read, so a peer that stopped reading would never get it:
one that has not taken it within :data:`CLOSE_DEADLINE_SECONDS` is cut off (the
TCP connection reset), which frees the channel and its buffers at once; once it
reads again it finds the connection gone and reconnects. Pings every
``channel_ping_seconds`` keep proxies from closing an idle channel and find dead
peers. A revoked or expired token's channels are closed (``CLOSE_UNAUTHORIZED``).
"""

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

import pydantic
from tornado import web
from tornado.escape import utf8
from tornado.iostream import IOStream, SSLIOStream, StreamClosedError
from tornado.websocket import (
    WebSocketClosedError,
    WebSocketHandler,
    WebSocketProtocol,
    WebSocketProtocol13,
)

from gpulayer.contracts import (
    CLOSE_RESYNC,
    CLOSE_UNAUTHORIZED,
    ChannelAnswer,
    ChannelCall,
    ChannelPush,
    ErrorBody,
)
from gpulayer.errors import AuthError, GpulayerError, NotFound, RateLimited

from ..auth import Principal, admit, bearer_token
from ..control_plane import ControlPlane
from . import channel_calls
from .base import STARTUP_WAIT_SECONDS, AppState, Limits
from .errors import error_body, status_of

log = logging.getLogger(__name__)

#: A worker's push loop waits this long after a failure before it acquires again.
_PUSH_RETRY_SECONDS = 1.0
#: A peer that has not taken the server's close frame this long after it was sent
#: (it stopped reading: the frame waits behind unsent answers) is cut off.
CLOSE_DEADLINE_SECONDS = 2.0
#: SO_LINGER on, zero seconds: closing the socket resets the connection and drops
#: what the kernel still holds for the peer.
_RESET = struct.pack("ii", 1, 0)


#: The most a channel takes from its socket's buffer in one read.
_CHUNK_BYTES = 65536


class _ChannelProtocol(WebSocketProtocol13):
    """Tornado's protocol, taking frames out of whole reads of the socket and
    writing them without a task each (docs/adr/0160).

    Tornado reads a frame in three or four exact reads (header, length, mask,
    payload). After the first, the rest of the frame sits in the stream's buffer
    with no read pending, and the stream takes its socket off the event loop until
    the next read asks for it again: two ``epoll_ctl`` calls and their bookkeeping
    per frame. Reading whatever has arrived (``partial``) empties the stream's
    buffer each time, so the socket stays registered.

    Tornado's ``write_message`` wraps the stream's future of each write in a new
    task (to raise ``WebSocketClosedError`` instead of ``StreamClosedError`` from
    it): a task and two turns of the event loop per frame sent. This one answers
    the stream's future itself, done already when the socket took the frame at
    once (:func:`when_taken`). And when nothing waits in the stream's buffer, it
    hands the frame to the socket itself: the stream's write would add a callback
    to its future only to mark a failure seen, one more turn of the loop per frame.
    What the socket does not take goes through the stream, as does every frame
    while anything waits there, so frames stay whole and in order. The framing,
    limits, compression and close handling are tornado's.
    """

    _pending: bytearray | None = None
    _taken: "asyncio.Future[None] | None" = None  # done: what a frame sent at once answers

    async def _read_bytes(self, n: int) -> bytes:
        pending = self._pending
        if pending is None:
            pending = self._pending = bytearray()
        while len(pending) < n:
            pending += await self.stream.read_bytes(_CHUNK_BYTES, partial=True)
        data = bytes(pending[:n])
        del pending[:n]
        self._wire_bytes_in += n
        return data

    def write_message(self, message: str | bytes | dict[str, Any], binary: bool = False) -> Any:
        """Send a message; the stream's future of its write (it fails with
        ``StreamClosedError`` when the connection closes before it is sent).

        Raises
        ------
        WebSocketClosedError
            When the connection is closed already.
        """
        if self._compressor is not None or isinstance(message, dict):
            return super().write_message(message, binary)
        data = utf8(message)
        self._message_bytes_out += len(data)
        opcode = 0x2 if binary else 0x1
        stream = self.stream
        try:
            if self.mask_outgoing or not _writes_now(stream):
                return self._write_frame(True, opcode, data)
            frame = _header(opcode, len(data)) + data
            self._wire_bytes_out += len(frame)
            try:
                sent = stream.write_to_fd(memoryview(frame))
            except OSError:  # (would block, or failed: the stream's write meets it again)
                sent = 0
            if sent == len(frame):
                return self._sent_at_once()
            return stream.write(frame[sent:])
        except StreamClosedError as e:
            raise WebSocketClosedError() from e

    def _sent_at_once(self) -> "asyncio.Future[None]":
        taken = self._taken
        if taken is None:
            taken = self._taken = asyncio.get_running_loop().create_future()
            taken.set_result(None)
        return taken


def _writes_now(stream: IOStream) -> bool:
    """Whether a frame may go to ``stream``'s socket now, ahead of the stream: it is
    open, connected (its TLS handshake done) and holds nothing unsent."""
    if stream.closed() or stream._connecting or len(stream._write_buffer):
        return False
    return not (isinstance(stream, SSLIOStream) and stream._ssl_accepting)


def _header(opcode: int, size: int) -> bytes:
    """A final, unmasked frame's header (RFC 6455 5.2), as tornado writes it."""
    if size < 126:
        return struct.pack("BB", 0x80 | opcode, size)
    if size <= 0xFFFF:
        return struct.pack("!BBH", 0x80 | opcode, 126, size)
    return struct.pack("!BBQ", 0x80 | opcode, 127, size)


def when_taken(
    sent: "asyncio.Future[None]", taken: Callable[["asyncio.Future[None]"], None]
) -> None:
    """Call ``taken`` with ``sent`` once the write is done: now, when the socket
    took the frame at once (no turn of the event loop), else when it is."""
    if sent.done():
        taken(sent)
    else:
        sent.add_done_callback(taken)


class ChannelHandler(WebSocketHandler):
    """Base of both channels: authentication before the upgrade, calls, limits."""

    #: Roles that may open the channel (admin always may).
    roles: frozenset[str] = frozenset({"admin"})
    #: The routes its calls may name.
    routes: list[channel_calls.Route] = []
    principal: Principal | None = None
    _cut_off_at: asyncio.TimerHandle | None = None  # armed by close()

    @property
    def state(self) -> AppState:
        """The app's published state."""
        state = self.settings["gpulayer"]
        assert isinstance(state, AppState)
        return state

    @property
    def gl(self) -> ControlPlane:
        """The control plane's services."""
        running = self.state.running
        if running is None:
            raise web.HTTPError(503, "gpulayer is not running")
        return running.plane

    @property
    def limits(self) -> Limits:
        """The app's limits and timings."""
        return self.state.limits

    @property
    def who(self) -> Principal:
        """The channel's principal (``prepare`` made sure there is one)."""
        if self.principal is None:
            raise AuthError("the channel needs a gpulayer token")
        return self.principal

    # ------------------------------------------------------------ handshake

    async def prepare(self) -> None:
        """Authenticate the handshake before the upgrade; refuse with the JSON error
        every route answers."""
        if not self.state.ready.is_set():
            try:
                await asyncio.wait_for(self.state.ready.wait(), STARTUP_WAIT_SECONDS)
            except TimeoutError:
                self._refuse(503, ErrorBody(code="unavailable", message="gpulayer is starting"))
                return
        try:
            token = bearer_token(self.request.headers.get("Authorization"))
            if token is not None:
                who = await self.gl.tokens.resolve(token, self.request.remote_ip)
            elif (server := self.server_principal()) is not None:
                who = server
            else:
                raise AuthError("the channel needs a gpulayer token (Authorization: Bearer gl_...)")
            admit(who, self.roles | {"admin"}, "GET", self.request.path)
            await self.admit_channel(who)
        except GpulayerError as e:
            if isinstance(e, RateLimited):
                self.set_header("Retry-After", str(max(1, round(e.retry_after_seconds))))
            self._refuse(status_of(e), error_body(e, 0, ""))
            return
        self.principal = who

    async def admit_channel(self, who: Principal) -> None:
        """More checks of a subclass, before the upgrade."""

    def server_principal(self) -> Principal | None:
        """Who a handshake without a gpulayer token is, for a subclass that admits
        the Jupyter server's own token (none here)."""
        return None

    def _refuse(self, status: int, body: ErrorBody) -> None:
        if status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="gpulayer"')
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body.model_dump_json())

    # ------------------------------------------------------------- settings

    def get_websocket_protocol(self) -> WebSocketProtocol | None:
        """Tornado's protocol with :class:`_ChannelProtocol`'s reads and writes."""
        protocol = super().get_websocket_protocol()
        if isinstance(protocol, WebSocketProtocol13):
            protocol.__class__ = _ChannelProtocol
        return protocol

    @property
    def max_message_size(self) -> int:
        """The largest frame taken: the route's body limit (docs/security.md)."""
        return self.limits.max_body_bytes

    @property
    def ping_interval(self) -> float | None:
        """Keepalive pings (0: none)."""
        return self.limits.channel_ping_seconds or None

    # ------------------------------------------------------------- life

    async def open(self, *args: Any, **kwargs: Any) -> None:
        """Register the channel and watch its token."""
        self.set_nodelay(True)  # small frames go out at once (no Nagle wait for an ACK)
        self._calls: set[asyncio.Task[None]] = set()
        self._loops: set[asyncio.Task[None]] = set()  # the token guard, a worker's pushes
        self._unsent = 0
        who = self.who
        if who.token_id is not None:
            self.gl.channels.opened(who.token_id, self._close_for)
            self._spawn(self._guard(who), self._loops)

    @staticmethod
    def _spawn(work: Any, into: set[asyncio.Task[None]]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        into.add(task)
        task.add_done_callback(into.discard)

    async def _guard(self, who: Principal) -> None:
        why = await self.gl.tokens.until_invalid(who)
        self._close_for(CLOSE_UNAUTHORIZED, why)

    def _close_for(self, code: int, why: str) -> None:
        self.close(code, why[:120])  # a close reason is at most 123 bytes

    def on_message(self, message: str | bytes) -> None:
        """Start answering a call (side by side with the others in flight)."""
        if isinstance(message, bytes):
            self.close(1003, "the channel takes JSON text frames")
            return
        try:
            call = ChannelCall.model_validate_json(message)
        except pydantic.ValidationError:
            self.close(1007, "not a ChannelCall")
            return
        if len(self._calls) >= self.limits.channel_max_calls:
            busy = RateLimited(
                f"more than {self.limits.channel_max_calls} calls in flight on one channel",
                retry_after_seconds=1.0,
            )
            body = error_body(busy, 429, "").model_dump_json()
            self.send(ChannelAnswer(id=call.id, status=429, body=body).model_dump_json())
            return
        # The call leaves the set itself as it ends (a done callback would take a
        # turn of the loop); one cancelled before it began stays until on_close.
        self._calls.add(asyncio.ensure_future(self._answer(call)))

    async def _answer(self, call: ChannelCall) -> None:
        try:
            answer = await channel_calls.answer(self.routes, self.gl, self.who, call, self.limits)
        except Exception:  # a call's own failure is its answer, never the channel's end
            log.exception("channel call %s %s failed", call.method, call.path)
            body = ErrorBody(code="internal", message="internal error; see the server log")
            answer = ChannelAnswer(id=call.id, status=500, body=body.model_dump_json())
        finally:
            self._calls.discard(asyncio.current_task())
        self.send(answer.model_dump_json())

    def send(self, text: str) -> None:
        """Write a frame, or close the channel for a resync when too much is unsent."""
        conn = self.ws_connection
        if conn is None or conn.is_closing():
            return
        size = len(text)
        # One answer, however large, goes (its route bounds it); answers piling up
        # behind one the peer has not taken do not.
        if self._unsent and self._unsent + size > self.limits.channel_max_unsent_bytes:
            self.close(CLOSE_RESYNC, "too much unsent: reconnect and resume from your offsets")
            return
        self._unsent += size
        try:
            sent = self.write_message(text)
        except WebSocketClosedError:
            return

        def taken(f: "asyncio.Future[None]") -> None:
            self._unsent -= size
            if not f.cancelled():
                f.exception()  # a closed socket: on_close has the rest

        when_taken(sent, taken)

    def close(self, code: int | None = None, reason: str | None = None) -> None:
        """Send the close frame; cut the peer off if it has not taken the frame
        within :data:`CLOSE_DEADLINE_SECONDS` (tornado itself waits 5 s, and then
        closes gracefully: the kernel keeps the unsent bytes for a peer that may
        never read them)."""
        conn = self.ws_connection  # (tornado forgets it once the frame is sent)
        super().close(code, reason)
        if self._cut_off_at is None and conn is not None and conn.stream is not None:
            loop = asyncio.get_running_loop()
            self._cut_off_at = loop.call_later(CLOSE_DEADLINE_SECONDS, self._cut_off, conn.stream)

    def _cut_off(self, stream: IOStream) -> None:
        """Reset the connection of a peer that did not take the close frame."""
        if stream.closed():
            return
        log.info("channel of %s cut off: it did not take the close frame", self.request.remote_ip)
        with contextlib.suppress(OSError):
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        stream.close()  # on_close follows (the frame loop's read fails)

    def on_close(self) -> None:
        """Stop the channel's calls and pushes; forget it."""
        if self._cut_off_at is not None:
            self._cut_off_at.cancel()
        for task in [*getattr(self, "_calls", ()), *getattr(self, "_loops", ())]:
            task.cancel()
        who = self.principal
        running = self.state.running
        if who is not None and who.token_id is not None and running is not None:
            running.plane.channels.closed(who.token_id, self._close_for)


class ClientChannelHandler(ChannelHandler):
    """``GET channel``: a client's (kernel, CLI) channel."""

    roles = frozenset({"viewer", "submitter"})
    routes = channel_calls.CLIENT_ROUTES


class WorkerChannelHandler(ChannelHandler):
    """``GET workers/{id}/channel``: a worker's channel; its assignments are pushed."""

    roles = frozenset({"worker"})
    routes = channel_calls.WORKER_ROUTES

    @property
    def max_message_size(self) -> int:
        """A log batch may pass the JSON limit, as on ``POST tasks/{id}/logs``."""
        return self.limits.max_batch_bytes

    async def admit_channel(self, who: Principal) -> None:
        """Its own worker, and one the control plane knows (404: register again)."""
        await self.gl.workers.check_channel(self.path_kwargs["worker_id"], who)

    async def open(self, *args: Any, **kwargs: Any) -> None:
        """Register the channel, then push assignments as they come."""
        await super().open()
        self._spawn(self._push(kwargs["worker_id"]), self._loops)

    async def _push(self, worker_id: str) -> None:
        """The acquire long poll, re-armed for as long as the channel is open. The
        first answer goes at once, empty when nothing waits: its fresh ``seq`` lets a
        worker whose previous channel broke show which answers never reached it
        (docs/adr/0150)."""
        hold = self.limits.long_poll_seconds
        resync = True
        pushers = self.gl.core.pushers
        try:
            while self.ws_connection is not None and not self.ws_connection.is_closing():
                try:
                    got = await self.gl.workers.acquire(worker_id, hold, self.who, resync=resync)
                except NotFound:
                    self.close(4404, "unknown worker: register again")
                    return
                except Exception:  # a loop of the channel: log, wait, acquire again
                    log.exception("pushing to worker %s failed", worker_id)
                    await asyncio.sleep(_PUSH_RETRY_SECONDS)
                    continue
                if got is not None:
                    self.send(ChannelPush(acquired=got).model_dump_json())
                if resync:  # its first answer went: a submit may push the next itself
                    resync = False
                    pushers[worker_id] = self._push_now
        finally:
            if pushers.get(worker_id) == self._push_now:
                del pushers[worker_id]

    async def _push_now(self) -> None:
        """Send what this worker's mailbox holds now (a task started at its submit)."""
        got = await self.gl.workers.take_now(self.path_kwargs["worker_id"])
        if got is not None:
            self.send(ChannelPush(acquired=got).model_dump_json())


ROUTES: list[tuple[str, type[ChannelHandler]]] = [
    (r"channel", ClientChannelHandler),
    (r"workers/(?P<worker_id>[^/]+)/channel", WorkerChannelHandler),
]
