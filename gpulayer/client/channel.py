"""The client's live channel: one WebSocket to the control plane (docs/channel.md).

:class:`Connection <gpulayer.client.connection.Connection>` sends the routes the
channel carries (:data:`gpulayer.contracts.CLIENT_CALLS`: submits, waits, log
follows, job reads, cancels) over it and every other route over HTTP; it falls
back to HTTP on its own when the upgrade fails (a proxy that blocks WebSockets,
an older control plane) or with ``GPULAYER_CHANNEL=http``. A call that waits
(a job wait, a log follow) is answered the moment there is something: output and
results are pushed to the caller over the open socket, with no request to make
again after each answer.

The client stays synchronous (STYLE.md): the calling thread reads its own answer
from the socket, with no thread in between (each hand-off between threads costs
a wake-up: ADRs 0144, 0159). Callers in several threads may share one channel: one
of them reads at a time and hands each :class:`~gpulayer.contracts.ChannelAnswer`
to the caller waiting for its ``id``; when it has its own, another waiting caller
takes over the reading. While nobody reads, a keeper thread looks at the socket
every :data:`KEEP_SECONDS` (answers the control plane's pings, notices a close,
pings a silent control plane). Library: ``websockets``' Sans-I/O client protocol
(the handshake, framing, masking, pings and closes); the socket is ours.
"""

import collections
import contextlib
import itertools
import logging
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Sequence

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from gpulayer import contracts

log = logging.getLogger(__name__)

#: The largest frame taken from the control plane (a page of logs, a job list).
MAX_FRAME_BYTES = 64 * 1024 * 1024
#: Keepalive: a channel silent this long is pinged, and one silent twice as long is dead.
PING_SECONDS = 20.0
#: How often the keeper looks at a channel nobody reads.
KEEP_SECONDS = 2.0
#: A send or a read of what ``poll`` said is there that takes longer than this (a
#: peer that stopped reading our frames, half a TLS record that never completes)
#: ends the channel. A client's frames are small (a larger payload goes as a blob).
STALL_SECONDS = 60.0
_RECV_BYTES = 256 * 1024


class ChannelUnavailable(Exception):
    """The channel could not be opened (the caller uses HTTP)."""


class ChannelClosed(Exception):
    """The channel closed before a call's answer came (the call may have run)."""


def ws_url(api: str) -> str:
    """The client channel's ``ws(s)://`` URL from the API's ``http(s)://`` root."""
    return "ws" + api.removeprefix("http").rstrip("/") + "/" + contracts.CLIENT_CHANNEL_PATH


class Channel:
    """An open client channel; see the module docstring. Use :meth:`open`."""

    def __init__(
        self, sock: socket.socket, protocol: ClientProtocol, early: Sequence[object]
    ) -> None:
        self._stop = threading.Event()  # ends the keeper
        self._sock = sock
        self._protocol = protocol
        self._io = threading.Lock()  # the protocol's state and writes to the socket
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._ids = itertools.count(1)
        self._answers: dict[int, contracts.ChannelAnswer | None] = {}  # None: not yet
        self._changed = threading.Condition()  # an answer came, or the reader left
        self._reading = False  # a caller (or the keeper) reads the socket now
        self._closed: str | None = None
        # Owned by the reader: messages read and not yet handed out, a fragmented
        # message's frames so far, when anything last came.
        self._inbox: collections.deque[bytes] = collections.deque()
        self._parts: list[bytes] = []
        self._heard = time.monotonic()
        self._take(early)
        keeper = threading.Thread(
            target=_keep, args=(weakref.ref(self), self._stop), name="gpulayer-channel", daemon=True
        )
        keeper.start()

    @classmethod
    def open(cls, api: str, token: str, *, tls: ssl.SSLContext | bool, timeout: float) -> "Channel":
        """Open the channel at the API root ``api`` with ``token``.

        Raises
        ------
        ChannelUnavailable
            When the handshake is refused (with its HTTP status) or fails.
        """
        try:
            uri = parse_uri(ws_url(api))
        except InvalidURI as e:
            raise ChannelUnavailable(str(e)) from e
        deadline = time.monotonic() + timeout
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((uri.host, uri.port), timeout)
            # Small frames go out at once: Nagle's wait for an ACK costs ~40 ms a call.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                context = tls if isinstance(tls, ssl.SSLContext) else ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=uri.host)
            protocol = ClientProtocol(uri, max_size=MAX_FRAME_BYTES)
            request = protocol.connect()
            request.headers["Authorization"] = f"Bearer {token}"
            protocol.send_request(request)
            sock.sendall(b"".join(protocol.data_to_send()))
            early: list[object] = []
            while protocol.state is State.CONNECTING:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                data = sock.recv(_RECV_BYTES)
                if data:
                    protocol.receive_data(data)
                else:
                    protocol.receive_eof()
                early += protocol.events_received()
                if protocol.handshake_exc is not None:
                    raise protocol.handshake_exc
                if not data:
                    raise ConnectionResetError("the control plane closed the connection")
            sock.settimeout(STALL_SECONDS)
        except InvalidStatus as e:
            _discard(sock)
            raise ChannelUnavailable(f"upgrade refused (HTTP {e.response.status_code})") from e
        except (OSError, InvalidHandshake) as e:  # TimeoutError and ssl.SSLError are OSErrors
            _discard(sock)
            raise ChannelUnavailable(f"{type(e).__name__}: {e}") from e
        return cls(sock, protocol, early)

    @property
    def closed(self) -> bool:
        """Whether the channel has closed (a new one must be opened). While nobody
        reads, what waits on the socket is read first: a close the control plane sent
        since (a restart) is known before a call is sent into it."""
        if self._closed is None and self._take_turn():
            try:
                self._catch_up()
            finally:
                self._end_turn()
        return self._closed is not None or self._protocol.state is not State.OPEN

    def _catch_up(self) -> None:
        """Read what waits on the socket without blocking and hand it out (the reader's)."""
        self._receive(0)
        self._hand_out()

    def _take_turn(self) -> bool:
        """Become the reader if nobody is (without waiting)."""
        with self._changed:
            if self._reading:
                return False
            self._reading = True
            return True

    def _end_turn(self) -> None:
        with self._changed:
            self._reading = False
            self._changed.notify_all()  # a waiting caller reads on

    def call(self, call: contracts.ChannelCall, timeout: float) -> contracts.ChannelAnswer:
        """Send ``call`` (its ``id`` is set here) and wait up to ``timeout`` s for its answer.

        Raises
        ------
        ChannelClosed
            If the channel closed (or never answered) first.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            if self._closed is not None:
                raise ChannelClosed(self._closed)
            call.id = next(self._ids)
            self._answers[call.id] = None
        try:
            self._send(call.model_dump_json(exclude_defaults=True).encode())
            return self._answer(call.id, deadline, timeout)
        finally:
            with self._changed:
                self._answers.pop(call.id, None)

    def _send(self, text: bytes) -> None:
        with self._io:
            if self._protocol.state is not State.OPEN:
                raise ChannelClosed(self._close("the channel closed"))
            self._protocol.send_text(text)
            self._flush()

    def _flush(self) -> None:
        """Write what the protocol has to send (the caller holds ``_io``)."""
        out = self._protocol.data_to_send()
        try:
            if data := b"".join(out):
                self._sock.sendall(data)
            if out and not out[-1]:  # end of stream: the protocol is done with the socket
                self._sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            raise ChannelClosed(self._close(f"the channel closed: {e}")) from e

    def _answer(self, call_id: int, deadline: float, timeout: float) -> contracts.ChannelAnswer:
        """Wait for the answer to ``call_id``: read the socket while nobody else does,
        else wait for the reader to hand it over (or to leave the reading to us)."""
        while True:
            with self._changed:
                while True:
                    if (got := self._answers.get(call_id)) is not None:
                        return got
                    if self._closed is not None:
                        raise ChannelClosed(self._closed)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ChannelClosed(f"no answer within {timeout:g}s")
                    if not self._reading:
                        self._reading = True
                        break
                    self._changed.wait(left)
            try:
                if (got := self._read_until(call_id, deadline)) is not None:
                    return got
            finally:
                self._end_turn()

    def _read_until(self, call_id: int, deadline: float) -> contracts.ChannelAnswer | None:
        """Read messages, handing each answer to its caller, until ``call_id``'s comes
        (answers it: the messages read with it are handed out first) or the deadline
        passes (None; the caller's loop says so)."""
        while (message := self._next(deadline)) is not None:
            answer = _parsed(message)
            if answer is not None and answer.id == call_id:
                self._hand_out()
                return answer
            self._store(answer)
        return None

    def _next(self, deadline: float) -> bytes | None:
        """The next message read (the reader's), None once the deadline passes.

        Raises
        ------
        ChannelClosed
            Once the channel closed and every message read before is handed out.
        """
        while not self._inbox:
            if self._closed is not None:
                raise ChannelClosed(self._closed)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._receive(left)
        return self._inbox.popleft()

    def _receive(self, timeout: float) -> None:
        """Read what comes within ``timeout`` s into the inbox (the reader's); answer
        pings; mark the channel closed when it closes."""
        sock = self._sock
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
        if not pending and not self._poll.poll(max(0, round(timeout * 1000))):
            return
        try:
            data = sock.recv(_RECV_BYTES)
        except OSError as e:  # a reset, a stall, a socket closed under us
            self._close(f"the channel closed: {e}")
            return
        with self._io:
            protocol = self._protocol
            if data:
                protocol.receive_data(data)
            else:
                protocol.receive_eof()
            events = protocol.events_received()
            with contextlib.suppress(ChannelClosed):
                self._flush()  # pongs, the answer to a close
        self._heard = time.monotonic()
        self._take(events)
        if protocol.state is not State.OPEN:
            self._close(f"the channel closed: {_why(protocol)}")

    def _take(self, events: Sequence[object]) -> None:
        """Put the messages among ``events`` in the inbox (the reader's)."""
        for frame in events:
            if not isinstance(frame, Frame):
                continue
            if frame.opcode is Opcode.TEXT or frame.opcode is Opcode.BINARY:
                if frame.fin:
                    self._inbox.append(bytes(frame.data))
                else:
                    self._parts = [bytes(frame.data)]
            elif frame.opcode is Opcode.CONT:
                self._parts.append(bytes(frame.data))
                if frame.fin:
                    self._inbox.append(b"".join(self._parts))
                    self._parts = []

    def _hand_out(self) -> None:
        """Hand every message in the inbox to its caller (the reader's, as it leaves)."""
        while self._inbox:
            self._store(_parsed(self._inbox.popleft()))

    def _store(self, answer: contracts.ChannelAnswer | None) -> None:
        if answer is None:
            return
        with self._changed:
            if answer.id in self._answers:  # else: its caller gave up waiting
                self._answers[answer.id] = answer
                self._changed.notify_all()

    def _look(self) -> bool:
        """The keeper's turn: take what came while nobody read, ping a silent control
        plane, give up on a dead one; False once the channel is closed."""
        if self._closed is not None:
            return False
        if time.monotonic() - self._heard < KEEP_SECONDS or not self._take_turn():
            return True  # a caller reads (and answers pings) now, or just did
        try:
            self._catch_up()
            silent = time.monotonic() - self._heard
            if silent > 2 * PING_SECONDS:
                self._close(f"the control plane did not answer a ping for {PING_SECONDS:g}s")
            elif silent > PING_SECONDS:
                with self._io, contextlib.suppress(ChannelClosed):
                    if self._protocol.state is State.OPEN:
                        self._protocol.send_ping(b"gpulayer")
                        self._flush()
        finally:
            self._end_turn()
        return self._closed is None

    def _close(self, why: str) -> str:
        """Mark the channel closed (every waiting caller learns ``why``) and shut its
        socket (a reader blocked on it wakes); the reason."""
        with self._changed:
            first = self._closed is None
            if first:
                self._closed = why
            self._changed.notify_all()
            why = self._closed or why
        if first:
            self._stop.set()
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        return why

    def close(self) -> None:
        """Say goodbye and close the socket (calls still waiting raise :class:`ChannelClosed`)."""
        with self._io, contextlib.suppress(ChannelClosed):
            if self._protocol.state is State.OPEN:
                self._protocol.send_close()
                self._flush()
        self._close("the channel was closed")
        self._sock.close()

    def __del__(self) -> None:
        self._stop.set()  # the keeper holds only a weak reference: it ends
        with contextlib.suppress(Exception):
            self._sock.close()


def _keep(ref: "weakref.ref[Channel]", stop: threading.Event) -> None:
    """The keeper thread: a look at the channel every :data:`KEEP_SECONDS` while it
    is open (and anyone holds it)."""
    while not stop.wait(KEEP_SECONDS):
        channel = ref()
        if channel is None or not channel._look():
            return
        del channel


def _why(protocol: ClientProtocol) -> str:
    """How the channel closed, in the words of ``websockets``' own exception."""
    if protocol.state is State.CLOSED:
        return str(protocol.close_exc)
    if protocol.close_rcvd is not None:  # closing: our answer to its close is sent
        return f"received {protocol.close_rcvd}"
    return "closing"


def _parsed(message: bytes) -> contracts.ChannelAnswer | None:
    try:
        return contracts.ChannelAnswer.model_validate_json(message)
    except ValueError:  # pydantic's ValidationError: not ours to answer
        log.debug("ignored a frame that is not a ChannelAnswer")
        return None


def _discard(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()
