"""Workers as processes on this machine: what the ``local`` and ``simulated``
providers' instances are.

Each instance is one ``gpulayer join`` process per node, started in a session of
its own (so it outlives a control-plane restart, like a cloud machine does), with
its output in ``<data_dir>/providers/<name>/<worker>.log``. The instances are
recorded in ``<data_dir>/providers/<name>/instances.json`` (the provider's own
state, as a cloud keeps its own), which :meth:`ProcessProvider.list` reads, so an
instance started before a restart is still seen (and swept when the store does not
know it).
"""

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..data_dir import private_dir
from .base import Launch, Provider, Seen

#: How long a terminated worker gets to release its tasks before SIGKILL.
STOP_GRACE_SECONDS = 10.0


@dataclass
class Entry:
    """One instance in the provider's state file."""

    instance_id: str
    external_id: str
    pids: list[int]
    workers: list[str]
    created_at: float
    boot_at: float  # when its worker process starts (a slow boot sleeps until then)
    vanish_at: float | None = None


class ProcessProvider(Provider):
    """Shared by ``local`` and ``simulated``: instances are worker processes."""

    def folder(self) -> Path:
        """This provider's state and logs."""
        return private_dir(self.data_dir / "providers" / self.name)

    def _state_path(self) -> Path:
        return self.folder() / "instances.json"

    def _read(self) -> dict[str, Entry]:
        try:
            raw = json.loads(self._state_path().read_text())
        except (OSError, ValueError):
            return {}
        return {k: Entry(**v) for k, v in raw.items()}

    def _write(self, entries: dict[str, Entry]) -> None:
        path = self._state_path()
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({k: asdict(v) for k, v in entries.items()}, f)
        tmp.replace(path)

    def gpu_env(self, launch: Launch) -> str | None:
        """``GPULAYER_SIMULATED_GPUS`` for the launch's workers (None: real GPUs)."""
        return None

    def spawn(self, launch: Launch, node: int, delay: float) -> int:
        """Start node ``node``'s ``gpulayer join`` (after ``delay`` s); its PID."""
        name = launch.workers[node]
        argv = [sys.executable, "-m", "gpulayer", "join", launch.url, "--name", name,
                "--slots", str(launch.slots), "--data-dir", str(self.folder() / name),
                "--register-timeout", "0"]  # fmt: skip
        for key, value in launch.labels.items():
            argv += ["--label", f"{key}={value}"]
        if launch.fingerprint:
            argv += ["--fingerprint", launch.fingerprint]
        if delay > 0:  # a slow boot: the process exists (and is ours) from the start
            argv = ["/bin/sh", "-c", f"sleep {delay:.3f}; exec {shlex.join(argv)}"]
        env = {**os.environ, "GPULAYER_JOIN_TOKEN": launch.tokens[node]}
        env.pop("GPULAYER_TOKEN", None)
        gpus = self.gpu_env(launch)
        if gpus is not None:
            env["GPULAYER_SIMULATED_GPUS"] = gpus
        log = self.folder() / f"{name}.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT, env=env,
                cwd=self.folder(), start_new_session=True,
            )  # fmt: skip
        finally:
            os.close(fd)
        _children[proc.pid] = proc
        return proc.pid

    async def start(self, launch: Launch, delay: float, vanish_after: float | None) -> str:
        """Start every node's worker and record the instance; its external id."""
        now = self.clock()
        pids = [self.spawn(launch, i, delay) for i in range(launch.nodes)]
        external = f"{self.name}-{pids[0]}"
        entries = self._read()
        entries[external] = Entry(
            launch.instance_id,
            external,
            pids,
            list(launch.workers),
            now,
            now + delay,
            None if vanish_after is None else now + delay + vanish_after,
        )
        self._write(entries)
        return external

    async def terminate(self, external_id: str) -> None:
        entries = self._read()
        entry = entries.pop(external_id, None)
        if entry is None:
            return
        await stop_all(entry)
        self._write(entries)

    async def list(self) -> list[Seen]:
        entries = self._read()
        now = self.clock()
        seen: list[Seen] = []
        changed = False
        for key, e in list(entries.items()):
            if e.vanish_at is not None and now >= e.vanish_at:
                await stop_all(e, grace=0.0)  # gone without a word, as a reclaimed VM
                del entries[key]
                changed = True
                continue
            alive = [p for p in e.pids if _alive(p, e.workers)]
            if not alive:
                del entries[key]
                changed = True
                continue
            running = now >= e.boot_at
            state = "running" if running else "pending"
            detail = f"process {e.pids[0]}" + ("" if running else " booting")
            seen.append(Seen(e.instance_id, key, state, detail))  # type: ignore[arg-type]
        if changed:
            self._write(entries)
        return seen

    def describe(self) -> dict[str, Any]:
        """What the state file holds (for tests and `gpulayer instances`)."""
        return {k: asdict(v) for k, v in self._read().items()}


#: Worker processes this control plane started, reaped when they end.
_children: dict[int, "subprocess.Popen[bytes]"] = {}


def _alive(pid: int, names: list[str]) -> bool:
    """Whether ``pid`` still runs one of our workers (not a reused PID)."""
    proc = _children.get(pid)
    if proc is not None:  # our own child (its exec may not have happened yet)
        if proc.poll() is None:
            return True
        _children.pop(pid, None)
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return any(f"--name {n} " in cmdline + " " for n in names)


async def stop_all(entry: Entry, grace: float = STOP_GRACE_SECONDS) -> None:
    """Stop an instance's processes: SIGTERM (the worker releases its tasks), then
    SIGKILL after ``grace`` s; each process group, by PID."""
    live = [p for p in entry.pids if _alive(p, entry.workers)]
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL if grace <= 0 else signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while live and loop.time() < deadline:
        await asyncio.sleep(0.1)
        live = [p for p in live if _alive(p, entry.workers)]
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pid in entry.pids:
        proc = _children.pop(pid, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, 5.0)
