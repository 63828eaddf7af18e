"""``GpulayerProvisioner``: a Jupyter kernel whose process runs on a gpulayer worker
(docs/kernels.md, docs/adr/0125).

Registered under jupyter_client's ``jupyter_client.kernel_provisioners`` entry
point as ``gpulayer-provisioner``; a kernelspec names it (``gpulayer kernel
install`` writes one) with its settings in ``metadata.kernel_provisioner.config``:
``gpus``, ``gpu_model``, ``pip``, ``env``, ``secrets``, ``idle_timeout``,
``start_timeout`` and ``sync_workdir``.

Starting the kernel submits a *relay session* (a ``session`` job with
``relay: true``) and waits while it is queued, logging why (the pending reasons)
each time that changes; after ``start_timeout`` it cancels the job and fails with
those reasons. Once the job runs, it opens the kernel's WebSocket on the control
plane, binds a :class:`~gpulayer.kernel_relay.ProxyEnd` with the key the
KernelManager generated (``ipc`` sockets in a 0700 folder of this user, so no
other local user reaches them), and waits for ``ready`` (the worker's end is
attached). The KernelManager then talks to those sockets as to a local kernel.

* **Credentials** come from the Jupyter server's own control plane when the
  provisioner runs in a server with the gpulayer extension (its URL and Jupyter
  token), else from the process's gpulayer configuration
  (``GPULAYER_URL``/``GPULAYER_TOKEN``, else the file ``gpulayer up`` saved);
  never from ``kernel.json`` (docs/adr/0138).
* **Interrupt**: the kernelspec says ``interrupt_mode: message`` (ipykernel
  answers ``interrupt_request`` on the control channel), so no signal is sent.
* **Liveness**: :meth:`poll` is None while the relay is open; the control plane
  closes it with a code when the job ends (0 for a kernel shut down or ended,
  1 for one that died), which Jupyter shows as for a local kernel.
* **Restart** ends the job and places a new relay session (a new kernel, maybe
  on another worker).
"""

import asyncio
import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import uuid
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Bool, Dict, Float, Int, List, Unicode
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from gpulayer import contracts, tls, transfer
from gpulayer.client import config
from gpulayer.client.connection import Connection
from gpulayer.client.pending import PendingNotes
from gpulayer.errors import GpulayerError
from gpulayer.kernel_relay import ProxyEnd
from gpulayer.sockets import nodelay

#: How often a queued kernel's job is read while it waits.
_POLL_SECONDS = 0.5
#: How long a dropped relay is opened again before the kernel counts as dead.
_REATTACH_SECONDS = 60.0
#: How much longer than ``start_timeout`` the job itself may stay queued.
_QUEUE_MARGIN_SECONDS = 30.0
_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
#: The largest frame taken from the control plane.
_MAX_FRAME_BYTES = 64 * 1024 * 1024


#: The prefix of a provisioner's socket folder in the temporary folder, its maker's
#: pid after it (a worker's kernel folders, ``glk-`` and random letters, are not
#: named so, nor removed here).
_IPC_PREFIX = "glk-"
_IPC_NAME = re.compile(re.escape(_IPC_PREFIX) + r"(\d+)-[^-/]+")


def _ipc_folder() -> str:
    """A new 0700 folder for a kernel's local sockets, named after this process,
    after removing those of this user's Jupyter servers that died without their
    cleanup (killed): nothing else removes them."""
    remove_orphaned_ipc_folders(tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{_IPC_PREFIX}{os.getpid()}-")


def remove_orphaned_ipc_folders(root: str) -> list[str]:
    """Remove the socket folders in ``root`` that this user's processes made and
    that outlived them; the names removed.

    Only a folder named ``glk-PID-...`` (a real folder, not a link, owned by this
    user) whose process no longer exists is removed: one whose pid was taken by
    another process since stays (a leftover, never a live kernel's sockets).
    """
    removed = []
    me = os.getuid()
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            m = _IPC_NAME.fullmatch(entry.name)
            if m is None:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or _alive(int(m[1])):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's; or no pid at all
        return True
    return True


class KernelStartFailed(RuntimeError):
    """The gpulayer kernel could not start (the message says why)."""


class RelayRefused(KernelStartFailed):
    """The control plane answered the relay's handshake without upgrading it."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class GpulayerProvisioner(KernelProvisionerBase):
    """Runs a kernel as a gpulayer relay session (see the module docstring)."""

    gpus = Int(0, help="GPUs the kernel reserves.").tag(config=True)
    gpu_model = Unicode(None, allow_none=True, help="A GPU model pattern ('A100*').").tag(
        config=True
    )
    pip = List(
        Unicode(), help="Requirements of the kernel's Python env (built on the worker)."
    ).tag(config=True)
    env = Dict(help="Environment variables of the kernel.").tag(config=True)
    secrets = List(Unicode(), help="The owner's secrets the kernel gets in its env.").tag(
        config=True
    )
    idle_timeout = Unicode(
        None, allow_none=True, help="End the kernel after this long without use ('30m')."
    ).tag(config=True)
    start_timeout = Float(300.0, help="Seconds to wait for a worker before giving up.").tag(
        config=True
    )
    sync_workdir = Bool(False, help="Ship the notebook's folder to the kernel at start.").tag(
        config=True
    )

    job_id: str | None = None
    _cwd: str | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._conn: Connection | None = None
        self._ws: ClientConnection | None = None
        self._proxy: ProxyEnd | None = None
        self._relay: asyncio.Task[int] | None = None
        self._exit: int | None = None
        #: Why the control plane ended the kernel (idle, cancelled): no automatic restart.
        self._ended_why: str | None = None
        self._shutdown_asked = False  # a shutdown (or restart) this server asked for
        self._ipc_dir: str | None = None  # the 0700 folder of the local sockets

    # ------------------------------------------------------------ process

    @property
    def has_process(self) -> bool:
        """Whether a kernel job was started and not cleaned up."""
        return self.job_id is not None

    async def poll(self) -> int | None:
        """None while the kernel lives; its exit code once the relay ended."""
        if self._relay is None:
            return self._exit if self._exit is not None else (None if self.job_id else 0)
        if not self._relay.done():
            return None
        return self._relay.result() if not self._relay.cancelled() else 0

    async def wait(self) -> int | None:
        """Wait until the kernel has ended; its exit code."""
        if self._relay is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._relay)
        return await self.poll()

    async def send_signal(self, signum: int) -> None:
        """Interrupts travel as control messages; SIGTERM/SIGKILL end the job."""
        if signum in (signal.SIGTERM, signal.SIGKILL):
            await self._end_job()

    async def kill(self, restart: bool = False) -> None:
        """End the kernel's job (its GPUs are released)."""
        await self._end_job()

    async def terminate(self, restart: bool = False) -> None:
        """End the kernel's job (its GPUs are released)."""
        await self._end_job()

    async def shutdown_requested(self, restart: bool = False) -> None:
        """The Jupyter server asks the kernel to shut down (or restart): its own wish."""
        self._shutdown_asked = True

    async def cleanup(self, restart: bool = False) -> None:
        """Close the relay and end the job if it still runs; a restart places a new one."""
        await self._end_job()
        await self._close_relay()
        self.job_id = None
        if not restart:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._ipc_dir is not None:
                shutil.rmtree(self._ipc_dir, ignore_errors=True)
                self._ipc_dir = None

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """A start may wait for a worker this long."""
        return max(recommended, self.start_timeout)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """What a restarted server needs to find the kernel's job again."""
        info = await super().get_provisioner_info()
        info["gpulayer_job_id"] = self.job_id
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """The kernel's job, as :meth:`get_provisioner_info` kept it."""
        await super().load_provisioner_info(provisioner_info)
        self.job_id = provisioner_info.get("gpulayer_job_id")

    # ------------------------------------------------------------ launch

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Keep the notebook's folder; the kernelspec's argv is never run here."""
        self._cwd = kwargs.get("cwd")
        kwargs.pop("extra_arguments", None)
        return await super().pre_launch(cmd=list(self.kernel_spec.argv), **kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Submit the relay session, wait for it, attach, and answer local sockets.

        A kernel the control plane ended (idle expiry, cancelled) is not started
        again by Jupyter's automatic restart: only a restart someone asks for
        places a new one (a kernel that died is restarted, as a local one is).
        """
        ended, asked = self._ended_why, self._shutdown_asked
        self._ended_why, self._shutdown_asked = None, False
        if ended is not None and not asked:
            raise KernelStartFailed(
                f"the gpulayer kernel was ended ({ended}); restart it to start a new one"
            )
        if self._conn is None:
            self._conn = await asyncio.to_thread(_connect, self.parent)
        conn = self._conn
        spec = await asyncio.to_thread(self._spec, conn)
        job = await asyncio.to_thread(conn.submit, spec)
        self.job_id, self._exit = job.id, None
        self.log.info("gpulayer kernel %s: job %s submitted", self.kernel_id, job.id)
        try:
            await self._until_running(conn, job.id)
            ws = await self._attach(conn, job.id)
        except BaseException:
            await self._end_job()
            self.job_id = None
            self._conn = None
            conn.close()  # a start that failed leaves nothing open
            raise
        km: Any = self.parent
        if self._ipc_dir is None:  # only this user may reach the sockets (ADR 0125)
            self._ipc_dir = await asyncio.to_thread(_ipc_folder)
        proxy = ProxyEnd(km.session.key, ws.send, scheme=km.session.signature_scheme,
                         transport="ipc", ip=os.path.join(self._ipc_dir, "kernel"))  # fmt: skip
        kept = {f"{n}_port": getattr(km, f"{n}_port", 0) for n in _CHANNELS}
        if km.transport != "ipc":
            kept = {}
        ports = await proxy.bind(kept)  # a restart keeps the sockets its clients know
        self._ws, self._proxy = ws, proxy
        self._relay = asyncio.ensure_future(self._serve(conn, job.id, ws, proxy))
        info: dict[str, Any] = {
            "transport": "ipc",
            "ip": proxy.ip,
            "key": km.session.key,
            "signature_scheme": km.session.signature_scheme,
            **ports,
        }
        self.connection_info = info  # type: ignore[assignment]
        return self.connection_info

    def _spec(self, conn: Connection) -> contracts.JobSpec:
        name = f"kernel-{uuid.uuid4().hex[:8]}"
        env = {str(k): str(v) for k, v in self.env.items()}
        spec: dict[str, Any] = {
            "kind": "session",
            "name": name,
            "session": {"name": name, "idle_timeout": self.idle_timeout, "relay": True},
            "resources": {"gpus": self.gpus, "gpu_model": self.gpu_model},
            "env": env,
            "secrets": list(self.secrets),
            "labels": {"gpulayer.dev/kernel": self.kernel_id or ""},
            # Should this server die while the kernel waits, the plane gives up too.
            "queue_timeout": self.start_timeout + _QUEUE_MARGIN_SECONDS,
        }
        if self.pip:
            spec["environment"] = {"pip": list(self.pip)}
        if self.sync_workdir and self._cwd:
            spec["bundle"] = _upload_workdir(conn, self._cwd)
        return contracts.JobSpec.model_validate(spec)

    async def _until_running(self, conn: Connection, job_id: str) -> None:
        """Wait while the job is queued, saying why; give up after ``start_timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        notes = PendingNotes(after=0.0)
        why = "waiting for placement"
        while True:
            job = await asyncio.to_thread(conn.job, job_id)
            if job.state == contracts.JobState.running:
                return
            if job.state in contracts.TERMINAL_STATES:
                raise KernelStartFailed(
                    f"the gpulayer kernel's job {job_id} {job.state}: {job.reason}"
                )
            if (note := notes.note(job)) is not None:
                why = note.removeprefix(f"job {job_id} ")
                self.log.warning("gpulayer kernel %s: %s", self.kernel_id, note)
            if loop.time() > deadline:
                raise KernelStartFailed(
                    f"no gpulayer worker took the kernel within {self.start_timeout:g}s"
                    f" (start_timeout): {why}"
                )
            await asyncio.sleep(_POLL_SECONDS)

    async def _attach(self, conn: Connection, job_id: str) -> ClientConnection:
        """Open the kernel's WebSocket and wait for ``ready``."""
        ws = await _open(conn, job_id)
        try:
            async with asyncio.timeout(max(self.start_timeout, 60.0)):
                while (frame := await ws.recv()) != contracts.KERNEL_READY:
                    del frame  # nothing else comes before ready
        except (TimeoutError, ConnectionClosed) as e:
            await ws.close()
            why = ws.close_reason or "the kernel did not start in time"
            raise KernelStartFailed(
                f"the gpulayer kernel's job {job_id} did not start: {why}"
            ) from e
        return ws

    async def _serve(
        self, conn: Connection, job_id: str, ws: ClientConnection, proxy: ProxyEnd
    ) -> int:
        """Relay until the kernel ends; its exit code. A dropped socket (a control plane
        restart) is opened again while the job runs."""
        while True:
            try:
                async for frame in ws:
                    if isinstance(frame, bytes):
                        await proxy.feed(frame)
            except ConnectionClosed:
                pass
            code = ws.close_code
            if code == contracts.CLOSE_KERNEL_ENDED:
                self._ended_why = ws.close_reason or "ended"
                return 0
            if code in (
                contracts.CLOSE_KERNEL_DIED,
                contracts.CLOSE_REPLACED,
                contracts.CLOSE_UNAUTHORIZED,
            ):
                self.log.warning("gpulayer kernel %s: %s", self.kernel_id, ws.close_reason)
                return 1
            reopened = await self._reattach(conn, job_id)
            if reopened is None:
                return 1
            ws = self._ws = reopened
            proxy.retarget(ws.send)  # frames from the Jupyter server go the new way

    async def _reattach(self, conn: Connection, job_id: str) -> ClientConnection | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _REATTACH_SECONDS
        while loop.time() < deadline:
            try:
                return await _open(conn, job_id)
            except RelayRefused as e:
                if e.status < 500 and e.status != 429:
                    return None  # the job ended (404), or the token is no longer good
                await asyncio.sleep(1.0)  # the control plane is starting
            except (OSError, InvalidHandshake, TimeoutError):
                await asyncio.sleep(1.0)
        return None

    # ------------------------------------------------------------ ending

    async def _end_job(self) -> None:
        job_id, conn = self.job_id, self._conn
        if job_id is None or conn is None:
            return
        with contextlib.suppress(GpulayerError):
            await asyncio.to_thread(conn.cancel, job_id)

    async def _close_relay(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            if relay.done() and not relay.cancelled():
                self._exit = relay.result()
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        if self._proxy is not None:
            await self._proxy.close()
            self._proxy = None


def _upload_workdir(conn: Connection, folder: str) -> str:
    """Pack the notebook's folder and upload it; its sha256 (the job's bundle)."""
    with transfer.pack_workdir(folder) as packed:
        return conn.upload_file(packed.path, packed.digest).sha256


def _connect(parent: Any = None) -> Connection:
    """The kernel's gpulayer connection: the Jupyter server's own control plane
    (:func:`_own_control_plane`), else the process's (environment, else the saved file)."""
    cfg = _own_control_plane(parent) or config.resolve()
    return Connection(cfg.url, cfg.token, fingerprint=cfg.fingerprint, insecure=cfg.insecure,
                      channel="http")  # fmt: skip


def _own_control_plane(parent: Any) -> config.ConnectionConfig | None:
    """The control plane of the Jupyter server this provisioner runs in, when that
    server loaded gpulayer's extension (``jupyter_ext``): the server's own URL and
    Jupyter token, which the control plane accepts as the Jupyter user
    (``c.GpulayerApp.jupyter_user_role``). None for any other process.

    The server is found up the provisioner's parent chain (KernelManager,
    MultiKernelManager, ServerApp) by duck typing: gpulayer never imports
    jupyter_server.
    """
    app = parent
    for _ in range(4):  # the ServerApp is the KernelManager's grandparent
        if app is None or hasattr(app, "extension_manager"):
            break
        app = getattr(app, "parent", None)
    try:
        extension = app.extension_manager.extensions.get("jupyter_ext")
        token = app.identity_provider.token
        url, certfile = app.connection_url, app.certfile
    except AttributeError:
        return None
    if extension is None or not extension.enabled or not token:
        return None
    # the server listens on this machine, so the token does not leave it over http://
    fingerprint = tls.fingerprint_of_file(certfile) if certfile else None
    return config.ConnectionConfig(url=url, token=token, fingerprint=fingerprint, insecure=True)


async def _open(conn: Connection, job_id: str) -> ClientConnection:
    """The Jupyter server's end of the kernel's relay.

    Raises
    ------
    RelayRefused
        When the control plane refuses it (the job ended, or is not a kernel of
        this token's owner; 503 while it starts), or a proxy answers without
        upgrading (no WebSocket: kernels need it).
    """
    path = contracts.KERNEL_CHANNEL_PATH.format(job_id=job_id)
    url, headers, context = conn.websocket_target(path)
    try:
        ws = await connect(
            url,
            additional_headers=headers,
            ssl=context if url.startswith("wss://") else None,
            max_size=_MAX_FRAME_BYTES,
            compression=None,
            open_timeout=20,
        )
    except InvalidStatus as e:
        status = e.response.status_code
        raise RelayRefused(
            f"the control plane refused the kernel's relay for job {job_id} (HTTP {status});"
            " gpulayer kernels need a WebSocket to it",
            status,
        ) from e
    nodelay(ws)
    return ws
