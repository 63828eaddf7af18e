"""What tests share besides fixtures: polling to a deadline instead of sleeping.

Import it relatively (pytest runs with ``--import-mode=importlib``, and every test
module is part of the ``tests`` package tree): ``from ..support import until``.
"""

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from gpulayer.cluster import LocalCluster

T = TypeVar("T")


class Clock:
    """Time as the test says: ``clock.now += 5`` moves it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fresh_interpreter(code: str) -> tuple[Any, list[str]]:
    """Run ``code`` in a new interpreter (``python -c``): the JSON its last line of
    output prints, and every line. A failure is an assertion with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"the probe failed:\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]), lines


def until(check: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail the
    test after ``timeout`` s. ``check`` runs at least once, and once more at the end."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


async def until_async(
    check: Callable[[], object | Awaitable[object]], timeout: float = 20.0, what: str = "condition"
) -> Any:
    """:func:`until` inside an event loop: ``check`` may be a plain or an async callable,
    and the loop keeps running between tries."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def until_long_polls(jp_serverapp: Any, n: int = 1, timeout: float = 10.0) -> None:
    """Until ``n`` long polls (acquire, wait, logs) are open on the test server."""
    notifier = jp_serverapp.web_app.settings["gpulayer"].running.plane.notifier
    await until_async(lambda: notifier.waiting() >= n, timeout, f"{n} open long poll(s)")


def entries(root: Path) -> Iterator[Path]:
    """Every file and folder under ``root``, tolerating folders that vanish while it
    walks (``Path.rglob`` raises when a folder is removed under it)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(folder, name)


def files(root: Path) -> set[Path]:
    """The files under ``root`` now (see :func:`entries`)."""
    return {p for p in entries(root) if p.is_file()}


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``path`` (a full or read-only disk on demand); skips
    the test with the reason when it cannot be mounted (not root, no mount)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to mount a small tmpfs (a full disk)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def cluster_on_small_disk(
    tmp_path: Path, size: str, **cluster: Any
) -> Iterator[tuple["LocalCluster", Path]]:
    """A running one-worker :class:`LocalCluster` whose database and blobs live on a
    ``size`` tmpfs (``<data_dir>/blobs`` links into it, ``db_path`` points there), and
    that tmpfs; skips like :func:`tmpfs`."""
    from gpulayer.cluster import LocalCluster

    data = tmp_path / "cluster"
    data.mkdir()
    with tmpfs(tmp_path / "disk", size) as disk:
        (disk / "blobs").mkdir()
        (data / "blobs").symlink_to(disk / "blobs")
        args = [f"--GpulayerApp.db_path={disk / 'gpulayer.db'}"]
        with LocalCluster(data, workers=1, server_args=args, **cluster) as running:
            yield running, disk


def skip_folder(items: list[pytest.Item], folder: Path, why: str | None) -> None:
    """Skip every collected test under ``folder``, saying ``why`` (None: none), for a
    conftest whose tests all need something this machine may lack."""
    if why is None:
        return
    for item in items:
        if folder in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=why))


def fill(directory: Path, leave_bytes: int = 0) -> Path:
    """Write a filler file in ``directory`` until only ``leave_bytes`` are free there."""
    filler = directory / "filler"
    free = shutil.disk_usage(directory).free - leave_bytes
    with filler.open("ab", buffering=0) as f:
        try:
            while free > 0:
                f.write(b"\xff" * min(free, 1 << 20))
                free -= 1 << 20
            f.flush()
        except OSError:  # full before the estimate
            pass
    return filler


class Proxy:
    """A TCP proxy to ``port`` that can be cut (its connections dropped, new ones
    refused) and restored on the same port: a network partition. While it holds
    (:meth:`hold`, until the next :meth:`cut`) it passes what clients send and drops
    what comes back: answers the server sent (and stored as sent) that never arrive."""

    def __init__(self, port: int) -> None:
        from gpulayer.cli.processes import free_port

        self.upstream = port
        self.port = free_port()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._holding = False

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def hold(self) -> None:
        """Drop everything the server sends from now on, on every connection."""
        self._holding = True

    def cut(self) -> None:
        with self._lock:
            socks, self._sockets = self._sockets, []
            if self._listener is not None:
                socks.append(self._listener)
                self._listener = None
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._holding = False  # (only once the held connections are gone)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            for a, b, back in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(a, b, back), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, back: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not (back and self._holding):
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def fake_pydantic_plugin(root: Path) -> dict[str, str]:
    """An installed distribution in ``root`` whose pydantic plugin prints "plugin
    loaded" on stderr once loaded; the environment of a process that has it."""
    (root / "glfake_plugin.py").write_text(
        "import sys\nprint('plugin loaded', file=sys.stderr)\n"
        "class Plugin:\n"
        "    def new_schema_validator(self, *args, **kwargs):\n"
        "        return None, None, None\n"
        "plugin = Plugin()\n"
    )
    info = root / "glfake_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: glfake-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\nglfake = glfake_plugin:plugin\n")
    return {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
