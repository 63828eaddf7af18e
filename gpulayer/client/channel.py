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
(no thread of ours in between: each hand-off between threads costs a wake-up,
ADR 0144). Callers in several threads may share one channel: one of them reads
at a time and hands each :class:`~gpulayer.contracts.ChannelAnswer` to the caller
waiting for its ``id``; when it has its own, another waiting caller takes over the
reading. Library: ``websockets``' sync client (docs/adr/0111), whose own thread
answers pings and closes while nobody reads.
"""

import contextlib
import itertools
import logging
import socket
import ssl
import threading
import time

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect

from gpulayer import contracts

log = logging.getLogger(__name__)

#: The largest frame taken from the control plane (a page of logs, a job list).
MAX_FRAME_BYTES = 64 * 1024 * 1024
#: Keepalive: a ping this often, and a channel whose pong does not come this long after is dead.
PING_SECONDS = 20.0


class ChannelUnavailable(Exception):
    """The channel could not be opened (the caller uses HTTP)."""


class ChannelClosed(Exception):
    """The channel closed before a call's answer came (the call may have run)."""


def ws_url(api: str) -> str:
    """The client channel's ``ws(s)://`` URL from the API's ``http(s)://`` root."""
    return "ws" + api.removeprefix("http").rstrip("/") + "/" + contracts.CLIENT_CHANNEL_PATH


class Channel:
    """An open client channel; see the module docstring. Use :meth:`open`."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._answers: dict[int, contracts.ChannelAnswer | None] = {}  # None: not yet
        self._changed = threading.Condition()  # an answer came, or the reader left
        self._reading = False  # a caller reads the socket now
        self._closed: str | None = None

    @classmethod
    def open(cls, api: str, token: str, *, tls: ssl.SSLContext | bool, timeout: float) -> "Channel":
        """Open the channel at the API root ``api`` with ``token``.

        Raises
        ------
        ChannelUnavailable
            When the handshake is refused (with its HTTP status) or fails.
        """
        url = ws_url(api)
        context = tls if isinstance(tls, ssl.SSLContext) else None
        try:
            ws = connect(
                url,
                additional_headers={"Authorization": f"Bearer {token}"},
                ssl=context if url.startswith("wss://") else None,
                open_timeout=timeout,
                max_size=MAX_FRAME_BYTES,
                ping_interval=PING_SECONDS,
                ping_timeout=PING_SECONDS,
                compression=None,
            )
        except InvalidStatus as e:
            raise ChannelUnavailable(f"upgrade refused (HTTP {e.response.status_code})") from e
        except (OSError, InvalidHandshake, TimeoutError) as e:
            raise ChannelUnavailable(f"{type(e).__name__}: {e}") from e
        # Small frames go out at once: Nagle's wait for an ACK costs ~40 ms a call.
        ws.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Held as a context (websockets >= 17.1 warns about a bare connection); the
        # reader thread's end or close() leaves it.
        return cls(contextlib.ExitStack().enter_context(ws))

    @property
    def closed(self) -> bool:
        """Whether the channel has closed (a new one must be opened)."""
        return self._closed is not None or self._ws.protocol.state is not State.OPEN

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
            self._ws.send(call.model_dump_json(exclude_defaults=True))
            return self._answer(call.id, deadline, timeout)
        except ConnectionClosed as e:
            raise ChannelClosed(self._close(f"the channel closed: {e}")) from e
        finally:
            with self._changed:
                self._answers.pop(call.id, None)

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
                with self._changed:
                    self._reading = False
                    self._changed.notify_all()  # a waiting caller reads on

    def _read_until(self, call_id: int, deadline: float) -> contracts.ChannelAnswer | None:
        """Read frames, handing each answer to its caller, until ``call_id``'s comes
        (answers it) or the deadline passes (None; the caller's loop says so)."""
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self._ws.recv(timeout=left, decode=False)
            except TimeoutError:
                return None
            except ConnectionClosed as e:
                raise ChannelClosed(self._close(f"the channel closed: {e}")) from e
            try:
                answer = contracts.ChannelAnswer.model_validate_json(message)
            except ValueError:  # pydantic's ValidationError: not ours to answer
                log.debug("ignored a frame that is not a ChannelAnswer")
                continue
            if answer.id == call_id:
                return answer
            with self._changed:
                if answer.id in self._answers:  # else: its caller gave up waiting
                    self._answers[answer.id] = answer
                    self._changed.notify_all()
        return None

    def _close(self, why: str) -> str:
        """Mark the channel closed (every waiting caller learns ``why``); the reason."""
        with self._changed:
            if self._closed is None:
                self._closed = why
            self._changed.notify_all()
            return self._closed

    def close(self) -> None:
        """Close the socket (calls still waiting raise :class:`ChannelClosed`)."""
        self._close("the channel was closed")
        self._ws.close()
