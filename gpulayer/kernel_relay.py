"""Both ends of a gpulayer kernel's relay (docs/kernels.md, docs/adr/0125).

A gpulayer kernel runs on a worker; the Jupyter server that shows it talks ZMQ to
a local stand-in. Between the two, each Jupyter message travels as one binary
WebSocket frame through the control plane (:mod:`jupyter_ext.kernel_relays`)::

    KernelManager ──ZMQ──▶ ProxyEnd ══ frame ══▶ control plane ══▶ KernelEnd ──ZMQ──▶ ipykernel
    (Jupyter server)      local sockets, the                        the kernel's own
                          connection file's key                     key and sockets

**Frames are unsigned; each end signs with its own key.** :class:`ProxyEnd`
verifies the HMAC of every message its clients send (a bad one is dropped), strips
the delimiter and the signature, and sends the rest as a frame;
:class:`KernelEnd` signs it again with the kernel's key and sends it on. The
reverse for replies, iopub and stdin requests. No key crosses the network or lands
in the control plane's store.

**Frame encoding** (:func:`pack`, :func:`unpack`): ``b"GK"``, a version byte, the
channel (0 shell, 1 control, 2 stdin, 3 iopub), the number of routing identities
and of message parts (two unsigned 16-bit numbers), one unsigned 32-bit length per
identity and part, then their bytes in order. The parts are the message's
``header``, ``parent_header``, ``metadata``, ``content`` and its buffers, exactly
as the wire protocol has them (JSON bytes), so nothing is parsed on the way.

**Identities**: the proxy's shell, control and stdin are ROUTER sockets, so each
frame from the Jupyter server carries the asking client's identity. The kernel end
keeps one DEALER per channel and client identity, with that identity as its own
(jupyter_client gives a client's shell and stdin the same identity, which is how
``input()`` finds the client that asked; the stdin DEALER is opened with the
shell's). Replies come back with the identity of the DEALER they arrived on.
iopub is a PUB on the proxy and a SUB to everything on the kernel end, the topic
travelling as the identity. The heartbeat is answered by the proxy itself; whether
the kernel lives is the job's state, which the provisioner follows.

Both ends only need a coroutine that sends a frame (``send``) and are fed the
frames from the other side (``feed``), so a test wires them back to back around a
local ipykernel without a control plane.
"""

import asyncio
import contextlib
import json
import logging
import os
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

CHANNELS = ("shell", "control", "stdin", "iopub")
_CODE = {name: i for i, name in enumerate(CHANNELS)}
_MAGIC = b"GK\x01"
_HEAD = struct.Struct("!3sBHH")
DELIM = b"<IDS|MSG>"
#: DEALERs the kernel end keeps per channel (one per client identity); the oldest
#: is closed past it (a browser tab that reloads makes a new client each time).
MAX_CLIENTS = 32

#: Sends one frame to the other end.
Send = Callable[[bytes], Awaitable[None]]


class BadFrame(ValueError):
    """A frame that is not a relay frame."""


@dataclass(frozen=True)
class Frame:
    """One Jupyter message without its delimiter and signature."""

    channel: str
    identities: list[bytes]
    parts: list[bytes]  # header, parent_header, metadata, content, *buffers


def pack(frame: Frame) -> bytes:
    """The frame's bytes (see the module docstring)."""
    pieces = [*frame.identities, *frame.parts]
    head = _HEAD.pack(_MAGIC, _CODE[frame.channel], len(frame.identities), len(frame.parts))
    lengths = struct.pack(f"!{len(pieces)}I", *(len(p) for p in pieces))
    return b"".join([head, lengths, *pieces])


def unpack(data: bytes) -> Frame:
    """The frame in ``data``.

    Raises
    ------
    BadFrame
        When ``data`` is not a whole relay frame.
    """
    try:
        magic, code, n_ids, n_parts = _HEAD.unpack_from(data)
        if magic != _MAGIC or code >= len(CHANNELS) or n_parts < 4:
            raise BadFrame("not a gpulayer kernel relay frame")
        n = n_ids + n_parts
        lengths = struct.unpack_from(f"!{n}I", data, _HEAD.size)
    except struct.error as e:
        raise BadFrame(f"a truncated relay frame: {e}") from e
    at = _HEAD.size + 4 * n
    if at + sum(lengths) != len(data):
        raise BadFrame("a relay frame whose lengths do not add up")
    pieces = []
    for size in lengths:
        pieces.append(data[at : at + size])
        at += size
    return Frame(CHANNELS[code], pieces[:n_ids], pieces[n_ids:])


class Signer:
    """HMAC signatures of one connection's key (jupyter_client's ``Session.sign``)."""

    def __init__(self, key: bytes, scheme: str = "hmac-sha256") -> None:
        from jupyter_client.session import Session

        self._session = Session(key=key, signature_scheme=scheme)
        self.key = key

    def sign(self, parts: list[bytes]) -> bytes:
        """The signature of header, parent, metadata and content."""
        return bytes(self._session.sign(parts[:4]))

    def valid(self, signature: bytes, parts: list[bytes]) -> bool:
        """Whether ``signature`` is right for ``parts`` (always, without a key)."""
        import hmac

        return not self.key or hmac.compare_digest(signature, self.sign(parts))


def split(msg: list[bytes]) -> tuple[list[bytes], bytes, list[bytes]] | None:
    """``(identities, signature, parts)`` of a wire message, None if malformed."""
    try:
        at = msg.index(DELIM)
    except ValueError:
        return None
    if len(msg) < at + 6:
        return None
    return msg[:at], msg[at + 1], msg[at + 2 :]


def wire(signer: Signer, identities: list[bytes], parts: list[bytes]) -> list[bytes]:
    """A wire message: identities, delimiter, signature, parts."""
    return [*identities, DELIM, signer.sign(parts), *parts]


def zmq_url(transport: str, ip: str, port: int) -> str:
    """The address of one of a kernel's sockets (jupyter_client's rule)."""
    return f"ipc://{ip}-{port}" if transport == "ipc" else f"tcp://{ip}:{port}"


class _End:
    """What both ends share: a context, pump tasks, closing."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._ctx = zmq.asyncio.Context()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sockets: list[zmq.asyncio.Socket] = []
        self.dropped = 0  # frames or messages refused (bad signature, malformed)

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.linger = 0
        self._sockets.append(sock)
        return sock

    async def _forward(self, frame: Frame) -> None:
        """Send a frame to the other end; one that cannot go (the socket is down, a
        reconnect is under way) is dropped, as ZMQ drops what no peer takes."""
        try:
            await self._send(pack(frame))
        except Exception as e:  # the transport's own error: closed, reset
            self.dropped += 1
            log.debug("dropped a %s frame: %s", frame.channel, e)

    def _spawn(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop the pumps and close every socket."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        self._ctx.term()


class ProxyEnd(_End):
    """The Jupyter server's end: ZMQ sockets that look like a kernel (``tcp`` on
    127.0.0.1, or ``ipc`` files under the prefix ``ip``: the provisioner's choice).

    Parameters
    ----------
    key, scheme
        The connection file's key and signature scheme (the KernelManager's).
    send
        Sends a frame towards the kernel.
    """

    def __init__(
        self,
        key: bytes,
        send: Send,
        *,
        scheme: str = "hmac-sha256",
        transport: str = "tcp",
        ip: str = "127.0.0.1",
    ) -> None:
        super().__init__(send)
        self._signer = Signer(key, scheme)
        self.transport = transport
        self.ip = ip  # tcp: the address; ipc: the path prefix of the socket files
        self._out: dict[str, zmq.asyncio.Socket] = {}

    def retarget(self, send: Send) -> None:
        """Send frames towards the kernel with ``send`` from now on (a new socket)."""
        self._send = send

    async def bind(self, ports: Mapping[str, int] | None = None) -> dict[str, int]:
        """Bind the five sockets (on ``ports`` where given and nonzero, else free
        ones) and start answering; returns the ports by ``<channel>_port`` name."""
        kinds = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER,
                 "iopub": zmq.PUB, "hb": zmq.REP}  # fmt: skip
        bound: dict[str, int] = {}
        for name, kind in kinds.items():
            sock = self._socket(kind)
            if kind == zmq.ROUTER:
                sock.router_handover = 1  # a client that reconnects keeps its identity
            want = (ports or {}).get(f"{name}_port", 0)
            if self.transport == "ipc":
                bound[f"{name}_port"] = _bind_ipc(sock, self.ip, want, set(bound.values()))
            else:
                bound[f"{name}_port"] = await _bind(sock, self.ip, want)
            if name == "hb":
                self._spawn(self._echo(sock))
            elif kind == zmq.ROUTER:
                self._spawn(self._pump(name, sock))
            self._out[name] = sock
        return bound

    async def _echo(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            await sock.send_multipart(await sock.recv_multipart())

    async def _pump(self, channel: str, sock: zmq.asyncio.Socket) -> None:
        """A client's messages on ``channel``: verified, stripped, sent as frames."""
        while True:
            msg = await sock.recv_multipart()
            got = split(msg)
            if got is None or not self._signer.valid(got[1], got[2]):
                self.dropped += 1
                log.warning("dropped a %s message with a bad signature or shape", channel)
                continue
            await self._forward(Frame(channel, got[0], got[2]))

    async def feed(self, data: bytes) -> None:
        """A frame from the kernel: signed with the connection's key, sent to the
        client it names (or published, for iopub)."""
        try:
            frame = unpack(data)
        except BadFrame:
            self.dropped += 1
            return
        sock = self._out.get(frame.channel)
        if sock is not None:
            await sock.send_multipart(wire(self._signer, frame.identities, frame.parts))


class KernelEnd(_End):
    """The worker's end: a client of the kernel's own sockets.

    Parameters
    ----------
    info
        The kernel's connection info (transport, ip, ports, key, signature_scheme).
    send
        Sends a frame towards the Jupyter server.
    on_state
        Called with ``busy`` or ``idle`` when the kernel's execution state changes.
    """

    def __init__(
        self,
        info: Mapping[str, Any],
        send: Send,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(send)
        key = info["key"]
        self._signer = Signer(key if isinstance(key, bytes) else key.encode(),
                              info.get("signature_scheme", "hmac-sha256"))  # fmt: skip
        self._info = info
        self._dealers: dict[tuple[str, bytes], zmq.asyncio.Socket] = {}
        self._on_state = on_state
        self._state = ""
        #: Set once a client asked the kernel to shut down (control channel).
        self.shutdown_requested = False

    def _url(self, channel: str) -> str:
        info = self._info
        return zmq_url(info["transport"], info["ip"], int(info[f"{channel}_port"]))

    async def start(self) -> None:
        """Subscribe to the kernel's iopub."""
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self._url("iopub"))
        self._spawn(self._iopub(sub))

    async def _iopub(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            got = split(await sub.recv_multipart())
            if got is None:
                continue
            topic, _, parts = got
            if topic and topic[-1].endswith(b".status"):
                self._note_state(parts[3])
            await self._forward(Frame("iopub", topic, parts))

    def _note_state(self, content: bytes) -> None:
        if self._on_state is None:
            return
        with contextlib.suppress(ValueError, AttributeError):
            state = json.loads(content).get("execution_state", "")
            if state in ("busy", "idle") and state != self._state:
                self._state = state
                self._on_state(state)

    def _dealer(self, channel: str, identity: bytes) -> zmq.asyncio.Socket:
        """The DEALER that speaks for client ``identity`` on ``channel``."""
        key = (channel, identity)
        sock = self._dealers.get(key)
        if sock is not None:
            return sock
        same = [k for k in self._dealers if k[0] == channel]
        if len(same) >= MAX_CLIENTS:
            old = self._dealers.pop(same[0])
            old.close(linger=0)
            self._sockets.remove(old)
        sock = self._socket(zmq.DEALER)
        if identity and not identity.startswith(b"\x00"):  # zmq's own ids cannot be set
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(self._url(channel))
        self._dealers[key] = sock
        self._spawn(self._replies(channel, identity, sock))
        return sock

    async def _replies(self, channel: str, identity: bytes, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                msg = await sock.recv_multipart()
            except zmq.ZMQError:  # closed: the oldest client's, past MAX_CLIENTS
                return
            got = split(msg)
            if got is None or not self._signer.valid(got[1], got[2]):
                self.dropped += 1
                continue
            await self._forward(Frame(channel, [identity, *got[0]], got[2]))

    async def feed(self, data: bytes) -> None:
        """A frame from the Jupyter server: signed with the kernel's key and sent to
        the kernel by the DEALER of its client."""
        try:
            frame = unpack(data)
        except BadFrame:
            self.dropped += 1
            return
        if frame.channel == "iopub" or not frame.identities:
            self.dropped += 1
            return
        identity, rest = frame.identities[0], frame.identities[1:]
        if frame.channel == "shell":
            self._dealer("stdin", identity)  # before the request: input() finds it
        elif frame.channel == "control" and _msg_type(frame.parts[0]) == "shutdown_request":
            self.shutdown_requested = True
        sock = self._dealer(frame.channel, identity)
        await sock.send_multipart(wire(self._signer, rest, frame.parts))


def _msg_type(header: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(header).get("msg_type", ""))
    return ""


def _bind_ipc(sock: zmq.asyncio.Socket, prefix: str, port: int, taken: set[int]) -> int:
    """Bind ``sock`` to ``ipc://<prefix>-<port>`` (jupyter_client's naming): ``port``
    when given (a restart keeps it), else the first number free."""
    if not port:
        port = 1
        while port in taken or os.path.exists(f"{prefix}-{port}"):
            port += 1
    sock.bind(zmq_url("ipc", prefix, port))
    return port


async def _bind(sock: zmq.asyncio.Socket, ip: str, port: int) -> int:
    """Bind ``sock`` to ``port`` (0: any free one); a port just given back by a
    previous proxy (a kernel restart keeps its ports) is tried for up to 2 s."""
    if not port:
        return int(sock.bind_to_random_port(f"tcp://{ip}"))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0
    while True:
        try:
            sock.bind(f"tcp://{ip}:{port}")
            return port
        except zmq.ZMQError:
            if loop.time() > deadline:
                return int(sock.bind_to_random_port(f"tcp://{ip}"))
            await asyncio.sleep(0.05)
