"""The client's live channel: one WebSocket to the control plane (docs/channel.md).

:class:`Connection <gpulayer.client.connection.Connection>` sends the routes the
channel carries (:data:`gpulayer.contracts.CLIENT_CALLS`: submits, waits, log
follows, job reads, cancels) over it and every other route over HTTP; it falls
back to HTTP on its own when the upgrade fails (a proxy that blocks WebSockets,
an older control plane) or with ``GPULAYER_CHANNEL=http``. A call that waits
(a job wait, a log follow) is answered the moment there is something: output and
results are pushed to the caller over the open socket, with no request to make
again after each answer.

The client stays synchronous (STYLE.md): a daemon thread reads the socket and
hands each :class:`~gpulayer.contracts.ChannelAnswer` to the caller waiting for
its ``id``; callers in several threads may share one channel. Library:
``websockets``' sync client (docs/adr/0111).
"""

import contextlib
import itertools
import logging
import socket
import ssl
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
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
        self._pending: dict[int, Future[contracts.ChannelAnswer]] = {}
        self._lock = threading.Lock()
        self._closed: str | None = None
        self._reader = threading.Thread(target=self._read, name="gpulayer-channel", daemon=True)
        self._reader.start()

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
        return self._closed is not None

    def call(self, call: contracts.ChannelCall, timeout: float) -> contracts.ChannelAnswer:
        """Send ``call`` (its ``id`` is set here) and wait up to ``timeout`` s for its answer.

        Raises
        ------
        ChannelClosed
            If the channel closed (or never answered) first.
        """
        fut: Future[contracts.ChannelAnswer] = Future()
        with self._lock:
            if self._closed is not None:
                raise ChannelClosed(self._closed)
            call.id = next(self._ids)
            self._pending[call.id] = fut
        try:
            self._ws.send(call.model_dump_json(exclude_defaults=True))
            return fut.result(timeout)
        except ConnectionClosed as e:
            raise ChannelClosed(f"the channel closed: {e}") from e
        except FutureTimeout as e:
            raise ChannelClosed(f"no answer within {timeout:g}s") from e
        finally:
            with self._lock:
                self._pending.pop(call.id, None)

    def _read(self) -> None:
        why = "the channel closed"
        try:
            for message in self._ws:
                try:
                    answer = contracts.ChannelAnswer.model_validate_json(message)
                except ValueError:  # pydantic's ValidationError: not ours to answer
                    log.debug("ignored a frame that is not a ChannelAnswer")
                    continue
                with self._lock:
                    fut = self._pending.pop(answer.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        except ConnectionClosed as e:
            why = f"the channel closed: {e}"
        except Exception as e:  # the reader thread's boundary: every waiter learns it
            why = f"the channel failed: {type(e).__name__}: {e}"
        finally:
            with self._lock:
                self._closed = why
                waiting, self._pending = list(self._pending.values()), {}
            for fut in waiting:
                if not fut.done():
                    fut.set_exception(ChannelClosed(why))

    def close(self) -> None:
        """Close the socket (calls still waiting raise :class:`ChannelClosed`)."""
        self._ws.close()
        self._reader.join(timeout=5.0)
