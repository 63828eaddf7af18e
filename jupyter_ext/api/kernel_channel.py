"""A gpulayer kernel's relay: two WebSockets paired by job id (docs/kernels.md,
docs/adr/0125).

* ``GET kernels/{job_id}/channel``: the Jupyter server's end (the kernel
  provisioner), with a bearer token of the kernel job's owner, or the Jupyter
  server's own token (the Jupyter user, as on the REST routes); another owner's job,
  one that is not a kernel, or one that ended is a 404.
* ``GET workers/{worker_id}/kernels/{job_id}/channel``: the worker's end, with
  that worker's own token; the kernel's task must be running there.

Both are authenticated before the upgrade, as the live channel is
(:class:`~jupyter_ext.api.channel.ChannelHandler`), and closed when their token is
revoked. Binary frames pass through :class:`~jupyter_ext.kernel_relays.KernelRelays`
untouched; a frame over ``max_batch_bytes`` closes the socket (1009), and a peer
that leaves more than ``channel_max_unsent_bytes`` unread is closed
(``CLOSE_RESYNC``: the provisioner reattaches). Kernels need the WebSocket: there
is no HTTP fallback for the relay.
"""

import asyncio
import hmac
import logging
from typing import Any

from tornado.websocket import WebSocketClosedError

from gpulayer.contracts import CLOSE_RESYNC

from ..auth import Principal
from ..kernel_relays import KernelRelays
from .base import jupyter_owner
from .channel import ChannelHandler, when_taken

log = logging.getLogger(__name__)

#: The notes a worker's end sends (text frames): the kernel's execution state.
_STATES = frozenset({"busy", "idle"})


class _RelayHandler(ChannelHandler):
    """One side of a kernel relay."""

    _admitted = False

    @property
    def relays(self) -> KernelRelays:
        """The control plane's relays."""
        return self.gl.kernel_relays

    @property
    def max_message_size(self) -> int:
        """Jupyter messages carry buffers (widget images): the batch limit."""
        return self.limits.max_batch_bytes

    @property
    def job_id(self) -> str:
        """The kernel's job."""
        return str(self.path_kwargs["job_id"])

    async def open(self, *args: Any, **kwargs: Any) -> None:
        """Register with the token guard; subclasses attach."""
        await super().open()
        self._relay_unsent = 0

    def relay(self, frame: bytes | str) -> None:
        """Write a frame; close the socket when its peer left too much unread."""
        conn = self.ws_connection
        if conn is None or conn.is_closing():
            return
        size = len(frame)
        if self._relay_unsent and self._relay_unsent + size > self.limits.channel_max_unsent_bytes:
            self.close(CLOSE_RESYNC, "too much unsent: attach again")
            return
        self._relay_unsent += size
        try:
            sent = self.write_message(frame, binary=isinstance(frame, bytes))
        except WebSocketClosedError:
            return

        def taken(f: "asyncio.Future[None]") -> None:
            self._relay_unsent -= size
            if not f.cancelled():
                f.exception()

        when_taken(sent, taken)

    def close_relay(self, code: int, why: str) -> None:
        """Close the socket with ``code`` and a reason its peer reads."""
        self.close(code, why.encode()[:120].decode(errors="ignore"))

    def on_close(self) -> None:
        """Detach from the relay."""
        super().on_close()
        running = self.state.running
        if running is not None and self._admitted:
            running.plane.kernel_relays.detach(self.job_id, self)


class KernelClientChannelHandler(_RelayHandler):
    """``GET kernels/{job_id}/channel``: the Jupyter server's end of a kernel."""

    roles = frozenset({"submitter"})

    def server_principal(self) -> Principal | None:
        """The Jupyter server's own token (``Authorization: token|Bearer T``) is the
        Jupyter user, as on the REST routes: a kernel provisioner inside the server
        that runs this control plane has no gpulayer token. Only from the header,
        which a browser page cannot set on a WebSocket, never from a cookie."""
        provider = self.settings.get("identity_provider")
        expected = getattr(provider, "token", "")
        scheme, _, value = self.request.headers.get("Authorization", "").partition(" ")
        value = value.strip()
        if not expected or not value or scheme.lower() not in ("token", "bearer"):
            return None
        if not hmac.compare_digest(value.encode(), str(expected).encode()):
            return None
        # a token login has no user name: the server's one owner for such logins
        owner = jupyter_owner(provider, "", self.state.anonymous_owner)
        return Principal(name=owner, role=self.limits.jupyter_user_role)

    async def admit_channel(self, who: Principal) -> None:
        """The owner's own running (or starting) kernel, else 404."""
        await self.relays.admit_client(self.job_id, who)
        self._admitted = True

    async def open(self, *args: Any, **kwargs: Any) -> None:
        """Attach (replacing another client) and watch for the job's end."""
        await super().open()
        self.relays.attach_client(self.job_id, self)
        self._spawn(self._watch(), self._loops)

    async def _watch(self) -> None:
        """Close the socket (with how it ended) once the kernel's job ends."""
        hold = self.limits.long_poll_seconds
        while self.ws_connection is not None and not self.ws_connection.is_closing():
            try:
                job = await self.gl.jobs.wait(self.job_id, hold)
            except Exception:  # the loop of an open socket: log, wait, ask again
                log.exception("watching kernel job %s failed", self.job_id)
                await asyncio.sleep(1.0)
                continue
            if job is not None:
                await self.relays.ended(self.job_id)
                return

    def on_message(self, message: str | bytes) -> None:
        """A Jupyter message for the kernel."""
        if isinstance(message, str):
            self.close(1003, "a kernel relay takes binary frames")
            return
        self.relays.from_client(self.job_id, message)


class KernelWorkerChannelHandler(_RelayHandler):
    """``GET workers/{worker_id}/kernels/{job_id}/channel``: the worker's end."""

    roles = frozenset({"worker"})

    async def admit_channel(self, who: Principal) -> None:
        """Its own worker, running that kernel's task, else 403/404."""
        await self.relays.admit_worker(self.path_kwargs["worker_id"], self.job_id, who)
        self._admitted = True

    async def open(self, *args: Any, **kwargs: Any) -> None:
        """Attach: the client hears ``ready``."""
        await super().open()
        self.relays.attach_worker(self.job_id, self)

    def on_message(self, message: str | bytes) -> None:
        """A kernel's message for the client, or (text) its execution state."""
        if isinstance(message, str):
            if message in _STATES:
                self.relays.state(self.job_id, message)
            return
        self.relays.from_worker(self.job_id, message)


ROUTES: list[tuple[str, type[ChannelHandler]]] = [
    (r"kernels/(?P<job_id>[^/]+)/channel", KernelClientChannelHandler),
    (r"workers/(?P<worker_id>[^/]+)/kernels/(?P<job_id>[^/]+)/channel", KernelWorkerChannelHandler),
]
