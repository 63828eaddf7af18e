"""A private Slurm cluster for tests: munged, slurmctld and slurmd(s), started by PID
with a config of their own and stopped by PID, whatever happens.

The recipe, measured, is ``infra-feasibility.md`` §1 and §1b. Everything lives in one
folder (``/var/tmp/gl-slurm-*``, every parent traversable, as munged demands):
``slurm.conf`` and ``gres.conf``, munge's key and socket (``AuthInfo=socket=``, so
the machine's own ``/run/munge`` is never used), state, spools, logs, and the fake
GPUs: character devices made with ``mknod`` (Slurm 22.05 drops GPUs without a
``File=``, and sets no ``CUDA_VISIBLE_DEVICES`` for a plain file). Ports are free
ones, so two runs never meet; ``SLURM_CONF`` (:attr:`SlurmCluster.env`) points the
clients (``sbatch``, ``squeue``, ``scancel``) at it.

Every daemon runs in the foreground (``-D``/``-F``), so its PID is the one we hold.
Stopping cancels every job, then ends the daemons (SIGTERM, then SIGKILL), then kills
by PID any process still carrying this cluster's ``SLURM_CONF`` in its environment
(a job's ``slurmstepd`` children outlive ``slurmd``). Each cluster records itself in
``/run/gpulayer-slurm/<tag>.json`` with its owner's PID; a record whose owner is gone
(a run that was killed) is cleaned the same way at the next start.

Nodes run where a *launcher* starts them: on this machine (``127.0.0.1``, the real
hostname) or on a host of ``tests/hosts/harness.py`` (its network namespace and
hostname).

By hand (as root)::

    python -m tests.slurm.daemons up      # one node with 2 fake GPUs; Ctrl-C stops it
    python -m tests.slurm.daemons down    # clean what a killed run left
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path("/run/gpulayer-slurm")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
STOP_GRACE_SECONDS = 10.0
#: A node's GPUs are character devices 195:N (NVIDIA's major), made here.
NVIDIA_MAJOR = 195

#: ``launch(argv, label, env) -> Popen``: start a daemon somewhere (this machine, a host).
Launcher = Callable[[Sequence[str], str, Mapping[str, str]], "subprocess.Popen[bytes]"]
#: ``client(argv, env) -> CompletedProcess``: run a Slurm client where slurmctld is reachable.
Client = Callable[[Sequence[str], Mapping[str, str]], "subprocess.CompletedProcess[str]"]


def missing() -> str | None:
    """Why a Slurm cluster cannot be made here (None when it can)."""
    if sys.platform != "linux":
        return "Slurm tests need Linux"
    if os.geteuid() != 0:
        return "Slurm tests need root (daemons as root, fake GPU devices); CI runs as root"
    for tool in DAEMONS:
        if shutil.which(tool) is None:
            return f"Slurm tests need `{tool}` (apt-get install slurmctld slurmd slurm-client)"
    return None


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One slurmd: its Slurm name, the address slurmctld reaches it at, its hostname and
    where it runs."""

    name: str
    address: str
    hostname: str
    launch: Launcher
    gpus: int = 2
    cpus: int = 4


@dataclass
class SlurmCluster:
    """See the module docstring. ``with SlurmCluster(...) as slurm: slurm.run("sinfo")``."""

    nodes: list[Node]
    controller: tuple[str, str]  # (hostname, address) of slurmctld
    launch_controller: Launcher
    partition: str = "gpu"
    max_nodes: int | None = None  # the partition's MaxNodes (None: unlimited)
    max_time_minutes: int = 60
    client: Client | None = None  # None: on this machine
    root: Path = field(default_factory=lambda: _make_root())
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.record = STATE_DIR / f"{self.tag}.json"
        self.ctl_port, self.node_port = free_port(), free_port()

    @property
    def conf(self) -> Path:
        """This cluster's ``slurm.conf``."""
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (or a control plane that calls sbatch) needs."""
        return {"SLURM_CONF": str(self.conf)}

    def log(self, name: str) -> str:
        """A daemon's log (``slurmctld``, ``slurmd-<node>``, ``munged``)."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (on this machine, or where
        :attr:`client` runs it)."""
        if self.client is not None:
            done = self.client(argv, self.env)
        else:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                                  env={**os.environ, **self.env})  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done

    # ------------------------------------------------------------------ start

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        """Clean stale clusters, write the config, start the daemons; returns when every
        node is idle."""
        clean_stale()
        STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._write_record()
        try:
            self._write_config()
            self._start_daemons(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self) -> None:
        r = self.root
        for sub in ("state", "log", "munge", *(f"spool/{n.name}" for n in self.nodes)):
            (r / sub).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(128))
        gpus = max((n.gpus for n in self.nodes), default=0)
        for i in range(gpus):
            os.mknod(r / f"fake-nvidia{i}", 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, i))
        host, address = self.controller
        lines = [
            "ClusterName=gltest",
            f"SlurmctldHost={host}({address})",
            f"SlurmctldPort={self.ctl_port}",
            f"SlurmdPort={self.node_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/munge/socket",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "EnforcePartLimits=ALL",
            "MinJobAge=3600",
            "SlurmdTimeout=10",
            "KillWait=3",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
        ]
        for n in self.nodes:
            lines.append(
                f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.hostname}"
                f" CPUs={n.cpus} RealMemory=4000" + (f" Gres=gpu:{n.gpus}" if n.gpus else "")
            )
        limit = "" if self.max_nodes is None else f" MaxNodes={self.max_nodes}"
        lines.append(
            f"PartitionName={self.partition} Nodes=ALL Default=YES"
            f" MaxTime={self.max_time_minutes}{limit} State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        gres = [f"NodeName={n.name} Name=gpu File={r}/fake-nvidia[0-{n.gpus - 1}]"
                for n in self.nodes if n.gpus]  # fmt: skip
        (r / "gres.conf").write_text("\n".join(gres) + "\n")

    def _start_daemons(self, timeout: float) -> None:
        r = self.root
        munge = r / "munge"
        self.procs["munged"] = _local(
            ["munged", "-F", f"--socket={munge}/socket", f"--key-file={munge}/munge.key",
             f"--log-file={r}/log/munged.log", f"--pid-file={munge}/munged.pid",
             f"--seed-file={munge}/seed"], "munged", self.env)  # fmt: skip
        self._until(lambda: (munge / "socket").exists(), 20, "munged's socket")
        self.procs["slurmctld"] = self.launch_controller(
            ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld", self.env
        )
        for n in self.nodes:
            self.procs[f"slurmd-{n.name}"] = n.launch(
                ["slurmd", "-D", "-N", n.name, "-f", str(self.conf)], f"slurmd-{n.name}", self.env
            )
        self._write_record()
        self._until(self._all_idle, timeout, "every node idle")

    def _all_idle(self) -> bool:
        done = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return len(states) == len(self.nodes) and set(states.values()) == {"idle"}

    def _until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            dead = [name for name, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{self.log(n)[-2000:]}" for n in self.procs)
                raise RuntimeError(f"slurm: waiting for {what}: {dead or 'timed out'}\n{logs}")
            time.sleep(0.1)

    def _write_record(self) -> None:
        import psutil

        rec = {
            "tag": self.tag,
            "pid": os.getpid(),
            "started": psutil.Process().create_time(),
            "root": str(self.root),
            "conf": str(self.conf),
            "daemons": {k: p.pid for k, p in self.procs.items()},
        }
        self.record.write_text(json.dumps(rec))

    # ------------------------------------------------------------------- stop

    def stop(self) -> None:
        """Cancel every job, stop the daemons and every process of this cluster (by
        PID), remove its folder and record. Safe to call twice."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", "--partition", self.partition, check=False)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and self._jobs_running():
                    time.sleep(0.2)
        for name in sorted(self.procs, key=lambda n: n == "munged"):  # munged last
            _stop(self.procs[name])
        kill_conf_holders(str(self.conf))
        if keep := os.environ.get("GPULAYER_SLURM_KEEP_LOGS"):
            shutil.copytree(self.root / "log", Path(keep) / self.tag, dirs_exist_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)
        self.record.unlink(missing_ok=True)

    def _jobs_running(self) -> bool:
        out = self.run("squeue", "-h", "-o", "%T", check=False).stdout.split()
        return any(s in ("RUNNING", "COMPLETING", "CONFIGURING") for s in out)


def _make_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="gl-slurm-", dir="/var/tmp"))
    root.chmod(0o755)  # munged wants every folder on its socket's path traversable
    return root


def _local(argv: Sequence[str], label: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start a daemon on this machine, in its own session; its output in
    ``<cluster>/log/<label>.out``."""
    log = Path(env["SLURM_CONF"]).parent / "log" / f"{label}.out"
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)  # fmt: skip


def local_launcher() -> Launcher:
    """Start daemons on this machine (the root namespace)."""
    return _local


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_conf_holders(conf: str) -> list[int]:
    """SIGKILL (by PID) every process whose environment names ``conf`` as SLURM_CONF:
    what jobs of that cluster left running. The PIDs killed."""
    needle = f"SLURM_CONF={conf}\0".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def _alive(pid: int, started: float) -> bool:
    try:
        import psutil

        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except Exception:  # gone, or not ours to read
        return False


def clean_stale() -> list[str]:
    """Stop what clusters of runs that were killed left (daemons and jobs, by PID); the
    tags cleaned."""
    removed = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if _alive(int(rec["pid"]), float(rec["started"])):
            continue
        kill_conf_holders(rec["conf"])
        for pid in rec.get("daemons", {}).values():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if rec["conf"].encode() in cmdline or b"munged" in cmdline:
                    os.kill(int(pid), signal.SIGKILL)
        root = Path(rec["root"])
        if root.name.startswith("gl-slurm-"):
            shutil.rmtree(root, ignore_errors=True)
        path.unlink(missing_ok=True)
        removed.append(str(rec["tag"]))
    return removed


def one_node(gpus: int = 2, **kw: object) -> SlurmCluster:
    """One slurmd on this machine (``127.0.0.1``, named ``gl1``) with ``gpus`` fake GPUs."""
    host = socket.gethostname().split(".")[0]
    node = Node("gl1", "127.0.0.1", host, local_launcher(), gpus=gpus)
    return SlurmCluster([node], (host, "127.0.0.1"), local_launcher(), **kw)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """``up`` / ``down``."""
    verb = (argv if argv is not None else sys.argv[1:] or ["up"])[0]
    if why := missing():
        print(f"slurm: {why}", file=sys.stderr)
        return 2
    if verb == "down":
        print("cleaned:", " ".join(clean_stale()) or "nothing")
        return 0
    with one_node() as slurm:
        print(f"export SLURM_CONF={slurm.conf}\nCtrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
