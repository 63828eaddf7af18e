"""Headless Jupyter kernels on a worker, for ``cell`` and ``session`` tasks
(:mod:`gpulayer.worker.kernel_runs`).

A cell runs in a real ipykernel started with jupyter_client's
``AsyncKernelManager`` (transport ``ipc``: no ports, no unencrypted-TCP
warning), so what it shows is real Jupyter messages. The kernel's sockets and
connection file are in a 0700 folder of the user the kernel runs as (the task
user, when there is one), so no other local user can reach the kernel
(docs/adr/0074-kernels-keep-ipc-in-a-folder-of-the-task-user.md). Each iopub message of the
cell (``stream``, ``display_data``, ``update_display_data``,
``execute_result``, ``error``, ``clear_output``) becomes one ``iopub`` log line
holding a :class:`~gpulayer.contracts.KernelMessage`, in the order the kernel
sent them; after them comes gpulayer's own ``execute_reply`` line. The lines
ride the task's :class:`~gpulayer.worker.logs.LogShipper`, so they are
numbered, batched, resent and followed like any output (docs/adr/0040).

:class:`Kernel` is one kernel and its client; :class:`KernelHost` keeps the
sessions' kernels by name. ``jupyter_client`` is imported on first use, so a
worker that never runs a cell does not pay for it.
"""

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpulayer import contracts as c
from gpulayer.worker.environments import interpreter
from gpulayer.worker.runs import Run
from gpulayer.worker.spawning import child_options, remove_when_gone, removed, task_user

log = logging.getLogger(__name__)


RELAYED = frozenset(
    {"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"}
)
_LINE_CHARS = 60_000  # below LogEntry's 65536, so the shipper never splits a piece again
_MAX_MESSAGE_CHARS = 32 * 1024 * 1024  # a bigger output is replaced by a note
_START_TIMEOUT_SECONDS = 60.0
_POLL_SECONDS = 0.5  # how often a silent kernel is checked for being alive


class KernelDied(Exception):
    """The kernel process ended while it was running code."""


def encode(msg: c.KernelMessage) -> list[str]:
    """The ``iopub`` log lines of one message (several when it is long)."""
    text = msg.model_dump_json()
    if len(text) > _MAX_MESSAGE_CHARS:
        note = c.KernelMessage(
            msg_type="stream",
            content={
                "name": "stderr",
                "text": f"[gpulayer: a {msg.msg_type} of {len(text) >> 20} MiB was not relayed]\n",
            },
        )
        text = note.model_dump_json()
    if len(text) <= _LINE_CHARS:
        return [text]
    parts = [text[i : i + _LINE_CHARS] for i in range(0, len(text), _LINE_CHARS)]
    return [c.FRAGMENT + p for p in parts[:-1]] + [parts[-1]]


class Kernel:
    """One headless ipykernel and its client."""

    def __init__(self, env: Mapping[str, str], cwd: Path, *, worker_only: bool = False) -> None:
        """``worker_only``: no frontend will see this kernel (a cell's or a session's):
        it publishes no ``busy`` or ``execute_input`` (ADR 0153)."""
        self.worker_only = worker_only
        self.env = dict(env)
        self.cwd = cwd
        self.lock = asyncio.Lock()  # one execution at a time: one iopub reader
        self._dir = Path(tempfile.mkdtemp(prefix="glk-"))  # short: ipc paths are limited
        remove_when_gone(self._dir)  # left by a worker killed with SIGKILL
        self._km: Any = None
        self._kc: Any = None
        self._executing = 0  # cells running (one at a time: the lock)
        self._watcher: asyncio.Task[None] | None = None  # see _watch
        self._receiving: asyncio.Future[Any] | None = None  # the message a cell waits for
        self._gone = False  # the watch saw the kernel process gone

    @property
    def pid(self) -> int | None:
        """The kernel process (for per-task telemetry)."""
        proc = getattr(getattr(self._km, "provisioner", None), "process", None)
        return getattr(proc, "pid", None)

    async def start(self) -> None:
        """Start the kernel and wait until it answers.

        Raises
        ------
        KernelDied
            If it exits or does not answer within 60 s.
        """
        from jupyter_client.kernelspec import KernelSpec
        from jupyter_client.manager import AsyncKernelManager

        # The worker's own interpreter (or the job's env's), whatever kernelspecs the
        # machine has installed.
        # IPython's history stays in memory (In, Out, _, %history within the
        # kernel's life): written to its SQLite file it cost ~0.7 ms a cell, and
        # would leave every cell's code in the HOME of the worker or its task user.
        # No 0.5 ms sleep before each execute_reply (ipykernel's `_execute_sleep`, a
        # guard for clients that stop reading output at the reply; ipyparallel's
        # engines go without it too): the worker reads iopub to the request's `idle`,
        # which comes after every output of the cell (ADR 0142).
        # The kernel reads its shell messages on its main thread (ADR 0149).
        argv = [interpreter(self.env), "-m", "gpulayer.worker.kernel_launcher",
                "-f", "{connection_file}",
                "--HistoryManager.enabled=False", "--IPythonKernel._execute_sleep=0"]  # fmt: skip
        if self.worker_only:
            argv.append("--worker-only")  # kernel_launcher.WORKER_ONLY
        spec = KernelSpec(
            argv=argv,
            display_name="gpulayer",
            language="python",
        )
        km = AsyncKernelManager(transport="ipc", connection_file=str(self._dir / "kernel.json"))
        km._kernel_spec = spec  # jupyter_client takes a spec from disk only, else this
        self._km = km
        if (user := task_user()) is not None:
            # The kernel binds its sockets in the folder and reads the connection file:
            # both the task user's. Written now, jupyter_client keeps it at start.
            km.write_connection_file()
            for path in (self._dir, self._dir / "kernel.json"):
                os.chown(path, user.uid, user.gid)
        try:
            await km.start_kernel(env=self.env, cwd=str(self.cwd), **child_options())
            kc = km.client()
            kc.start_channels()
            self._kc = kc
            await kc.wait_for_ready(timeout=_START_TIMEOUT_SECONDS)
        except (RuntimeError, TimeoutError) as e:
            await self.shutdown()
            raise KernelDied(f"the kernel did not start: {e}") from e

    def connection_info(self) -> dict[str, Any]:
        """Where the kernel's sockets are, and its key (for a relay's kernel end)."""
        return dict(self._km.get_connection_info())

    @property
    def exit_code(self) -> int | None:
        """The kernel process's exit code once it ended."""
        proc = getattr(getattr(self._km, "provisioner", None), "process", None)
        code = getattr(proc, "returncode", None)
        return code if isinstance(code, int) else None

    async def alive(self) -> bool:
        """Whether the kernel process still runs."""
        return self._km is not None and bool(await self._km.is_alive())

    async def execute(
        self, code: str, on_message: Callable[[c.KernelMessage], None], *, silent: bool = False
    ) -> dict[str, Any]:
        """Run ``code``; every relayed message goes to ``on_message`` in order.

        Returns the ``execute_reply`` content once the kernel is idle again.

        Raises
        ------
        KernelDied
            If the kernel process ends before the reply.
        """
        kc = self._kc
        msg_id = kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False)
        self._executing += 1
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())
        relayed = False
        try:
            while True:  # iopub until this request's `idle`: then every output is in
                msg = await self._next(kc.iopub_channel)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue  # a previous, abandoned request's leftovers
                kind = msg["msg_type"]
                if kind == "status" and msg["content"].get("execution_state") == "idle":
                    break
                if kind in RELAYED:
                    on_message(
                        c.KernelMessage(
                            msg_type=kind,
                            content=msg["content"],
                            metadata=msg.get("metadata") or {},
                            transient=msg["content"].pop("transient", None) or {},
                        )
                    )
                    if not relayed:
                        # The `idle` and the reply are usually waiting already, and
                        # reading them takes no turn of the loop: let the first
                        # output's line be sent first (a cell's first output).
                        relayed = True
                        await asyncio.sleep(0)
            while True:  # the reply (it may come before or after `idle`)
                reply = await self._next(kc.shell_channel)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return dict(reply["content"])
        finally:
            self._executing -= 1

    async def _watch(self) -> None:
        """While cells run, look every half second whether the kernel process still
        does; once it is gone, end the wait of the running cell for its next message
        (:meth:`_next`). One watch for cells that follow one another, not a task per
        cell: it ends once no cell runs when it looks."""
        try:
            while self._executing and not self._gone:
                if not await self.alive():
                    self._gone = True
                    if self._receiving is not None:
                        self._receiving.cancel()
                    return
                await asyncio.sleep(_POLL_SECONDS)
        finally:
            self._watcher = None

    async def _ended(self) -> None:
        """Returns once the kernel process has ended (looked at every half second)."""
        while await self.alive():
            await asyncio.sleep(_POLL_SECONDS)

    async def _next(self, channel: Any) -> dict[str, Any]:
        """The channel's next message; :class:`KernelDied` once the kernel is gone
        and none is waiting.

        One receive per message: zmq's asyncio socket takes a waiting message at
        once, else its future waits on the socket, and the cell on that future
        alone (the watch cancels it when the kernel dies). jupyter_client's
        ``get_msg`` polls first and arms a timer for its timeout: a poller, a future
        and a timer per message, ~15% of the worker's CPU per cell (py-spy).
        """
        socket = getattr(channel, "socket", None)
        if socket is None or socket.closed:  # the channel was stopped under the cell
            await self._ended()
            raise KernelDied(self._death())
        frames = socket.recv_multipart()
        if not frames.done():
            if self._gone:
                frames.cancel()
                raise KernelDied(self._death())
            self._receiving = frames
            try:
                await frames
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the cell is cancelled
                # Else the receive was: by the watch, or by its socket closing (below).
            except Exception:  # the channel closed under the wait: looked at below
                pass
            finally:
                self._receiving = None
        if frames.cancelled() or frames.exception() is not None:
            # The channel was closed under the cell (its kernel is being shut down).
            await self._ended()
            raise KernelDied(self._death())
        session = self._kc.session
        _, wire = session.feed_identities(frames.result())
        msg: dict[str, Any] = session.deserialize(wire)
        return msg

    def _death(self) -> str:
        proc = getattr(getattr(self._km, "provisioner", None), "process", None)
        code = getattr(proc, "returncode", None)
        how = f" (exit code {code})" if code is not None else ""
        return f"the remote kernel died{how} while running the cell"

    async def interrupt(self) -> None:
        """SIGINT the kernel (a ``KeyboardInterrupt`` in the running cell)."""
        if await self.alive():
            await self._km.interrupt_kernel()

    async def shutdown(self) -> None:
        """Stop the kernel (gracefully, then by force) and remove its files."""
        if self._watcher is not None:
            self._watcher.cancel()
        try:
            if self._kc is not None:
                self._kc.stop_channels()
            if self._km is not None and await self._km.is_alive():
                await self._km.shutdown_kernel(now=False)
        except Exception:  # a kernel that is gone already, or will not die politely
            log.debug("kernel shutdown", exc_info=True)
            with contextlib.suppress(Exception):
                await self._km.shutdown_kernel(now=True)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
            removed(self._dir)


#: A session on a worker: ``(owner, name)``; two owners may each have a ``main``.
SessionKey = tuple[str, str]


def session_key(assignment: c.Assignment, name: str) -> SessionKey:
    """The key of session ``name`` of the assignment's owner."""
    return assignment.owner, name


class KernelHost:
    """The worker's sessions: their kernels, by owner and session name (a cell only
    ever reaches a session of its own job's owner)."""

    def __init__(self) -> None:
        self.sessions: dict[SessionKey, Kernel] = {}  # the kernels that are up
        self.runs: set[Run] = set()  # the session tasks running here
        # Sessions assigned here whose kernel is not up yet: cells placed meanwhile wait.
        self._coming: dict[SessionKey, asyncio.Future[Kernel | None]] = {}

    def expect(self, key: SessionKey) -> None:
        """A session was assigned to this worker: its cells wait for its kernel."""
        if key not in self._coming or self._coming[key].done():
            self._coming[key] = asyncio.get_running_loop().create_future()

    def started(self, key: SessionKey, kernel: Kernel | None) -> None:
        """Session ``key``'s kernel is up (or, None, will not come): its cells go on."""
        fut = self._coming.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(kernel)

    async def kernel(self, key: SessionKey) -> Kernel | None:
        """The kernel of session ``key`` (waiting while it starts), or None."""
        if key in self.sessions:
            return self.sessions[key]
        fut = self._coming.get(key)
        return None if fut is None else await asyncio.shield(fut)

    async def close(self) -> None:
        """End every session (the agent is stopping)."""
        for run in list(self.runs):
            run.cancel("worker shutting down")
        kernels = list(self.sessions.values())
        self.sessions.clear()
        await asyncio.gather(*(k.shutdown() for k in kernels), return_exceptions=True)
