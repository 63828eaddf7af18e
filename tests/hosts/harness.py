"""Several hosts on one machine: network namespaces on a bridge, each with its own
address, hostname, folders, processes and faults.

Each host is a network namespace (``ip netns``) with one interface, ``eth0``, on
``10.200.0.0/24``, plugged into a bridge that lives in a namespace of its own (so
nothing is added to the machine's own network). The recipe, measured, and its one
safety rule are in ``infra-feasibility.md`` §2:

* Addresses of ``10.200.0.0/24`` exist only inside namespaces made here.
* While any harness runs, the root namespace has ``ip route add blackhole
  10.200.0.0/24`` (the *guard*), so a packet sent there by mistake from this
  machine's own namespace dies here instead of leaving the machine; it is removed
  when the last harness stops.
* Nothing in the root namespace ever sends to a host's address: tests drive the
  hosts only by starting processes inside them and reading their output.

Every process a host runs starts as
``nsenter --net=<its netns> unshare --uts --mount -- sh -c <setup> CMD...``: its own
hostname (the host's name), and a private mount namespace in which the host's own
folder is mounted at :attr:`Host.view` (the same path on every host, different
contents, as on real machines), the folder that holds every host's folder is
hidden under an empty tmpfs, and ``/tmp`` is the host's own (when the checkout and
Python do not live under ``/tmp``). ``HOME`` and ``TMPDIR`` point into the view.
So a worker that opens a file of the control plane by its path fails here as it
would on another machine. ``nsenter``, ``unshare`` and ``sh`` each ``exec`` the
next, so a spawned process's PID is the program's own.

Everything is torn down whatever happens (:meth:`Hosts.stop`: processes by PID,
then the namespaces, the folders and the guard), and a harness left behind by a
run that was killed is cleaned at the next start: each harness records itself in
``/run/gpulayer-hosts/<tag>.json`` with its owner's PID; a record whose owner is
gone is stale (the processes still inside its namespaces, listed by ``ip netns
pids``, are killed by PID).

By hand (as root)::

    python -m tests.hosts.harness up            # ctl, w1, w2, laptop; Ctrl-C tears down
    python -m tests.hosts.harness shell w1      # a shell on w1 (while `up` runs)
    python -m tests.hosts.harness down          # remove what a killed run left

``GPULAYER_HOSTS_KEEP_LOGS=DIR`` keeps every process's output in ``DIR/<tag>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.200.0.0/24"
PREFIX = "10.200.0."
FIRST_ADDRESS = 10  # ctl 10.200.0.10, w1 .11, ...
STATE_DIR = Path("/run/gpulayer-hosts")
DEFAULT_HOSTS = ("ctl", "w1", "w2", "laptop")
NETNS_DIR = Path("/run/netns")
TOOLS = ("ip", "tc", "iptables", "nsenter", "unshare", "mount")
STOP_GRACE_SECONDS = 10.0

#: Run inside each new process: hostname, the host's folder at the view, the other
#: hosts' folders hidden, the host's own /tmp; then the command.
_SETUP = """set -e
hostname "$GLH_NAME"
mount --rbind "$GLH_OWN" "$GLH_VIEW"
if [ -n "$GLH_TMP" ]; then mount --rbind "$GLH_TMP" /tmp; fi
mount -t tmpfs -o mode=0755,size=1m gl-hosts "$GLH_HOSTS"
unset GLH_NAME GLH_OWN GLH_VIEW GLH_TMP GLH_HOSTS
exec "$@"
"""


def missing() -> str | None:
    """Why hosts cannot be made here (None when they can)."""
    if sys.platform != "linux":
        return "hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "hosts need root (network namespaces, mounts, iptables); CI runs as root"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"hosts need `{tool}` (apt-get install iproute2 iptables util-linux)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a tool in the root namespace (never one that talks to a host's address)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


# ------------------------------------------------------------------- the guard


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (STATE_DIR / "lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def guard_present() -> bool:
    """Whether the root namespace blackholes the hosts' range."""
    routes = sh("ip", "route", "show", "type", "blackhole").stdout
    # "10.200.0.0/24" or "blackhole 10.200.0.0/24", depending on iproute2's version
    return any(SUBNET in line.split()[:2] for line in routes.splitlines())


def _alive(pid: int, started: float) -> bool:
    try:
        import psutil

        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except Exception:  # gone, or not ours to read: not alive for us
        return False


def _records() -> list[tuple[Path, dict[str, object]]]:
    out = []
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
    return out


def clean_stale() -> list[str]:
    """Remove every harness whose owner is gone; the tags removed."""
    removed = []
    with _state_lock():
        for path, rec in _records():
            if _alive(int(rec["pid"]), float(rec["started"])):  # type: ignore[arg-type]
                continue
            _remove(rec)
            path.unlink(missing_ok=True)
            removed.append(str(rec["tag"]))
        if not _records() and guard_present():
            sh("ip", "route", "del", "blackhole", SUBNET, check=False)
    return removed


def _remove(rec: Mapping[str, object]) -> None:
    """Kill what still runs in a harness's namespaces (by PID), delete them and its folder."""
    namespaces = [str(n) for n in rec.get("netns", [])]  # type: ignore[attr-defined]
    for ns in namespaces:
        if not (NETNS_DIR / ns).exists():
            continue
        pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for ns in namespaces:
        if (NETNS_DIR / ns).exists():
            sh("ip", "netns", "del", ns, check=False)
    root = Path(str(rec.get("root", "")))
    if root.name.startswith("gl-hosts-"):
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------- hosts


@dataclass
class Host:
    """One host: a network namespace with ``eth0`` at :attr:`address`, a hostname,
    its own folder (seen by its processes at :attr:`view`) and its processes."""

    name: str
    address: str
    netns: str
    port: str  # its cable's other end, in the bridge's namespace
    switch: str  # the bridge's namespace
    own: Path  # its folder, as the test (root namespace) sees it
    view: Path  # the same folder, as the host's processes see it
    hosts_dir: Path
    private_tmp: bool
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # --------------------------------------------------------------- folders

    @property
    def home(self) -> Path:
        """``HOME`` on the host (a path the host sees)."""
        return self.view / "home"

    @property
    def tmp(self) -> Path:
        """``TMPDIR`` on the host."""
        return self.view / "tmp"

    def outside(self, path: str | os.PathLike[str]) -> Path:
        """Where the test finds ``path`` (a path on the host) from outside."""
        return self.own / Path(path).relative_to(self.view)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A host's environment: nothing of the test's but PATH (this Python first),
        PYTHONPATH, the locale and Jupyter's path switch; ``extra`` on top."""
        bin_dir = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "PYTHONUNBUFFERED": "1",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        for keep in ("PYTHONPATH", "JUPYTER_PLATFORM_DIRS"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        return {**env, **(extra or {})}

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` as it runs on this host."""
        return [
            "nsenter", f"--net={NETNS_DIR / self.netns}",
            "unshare", "--uts", "--mount", "--propagation", "private", "--",
            "sh", "-c", _SETUP, self.name, *command,
        ]  # fmt: skip

    def _setup_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {
            **env,
            "GLH_NAME": self.name,
            "GLH_OWN": str(self.own),
            "GLH_VIEW": str(self.view),
            "GLH_TMP": str(self.own / "tmp") if self.private_tmp else "",
            "GLH_HOSTS": str(self.hosts_dir),
        }

    # ------------------------------------------------------------- processes

    def spawn(
        self, command: Sequence[str], *, label: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` here in its own session, its output in ``logs/<host>-<label>.log``
        (outside every host); it is stopped by PID when the harness stops."""
        log_file = self.logs / f"{self.name}-{label}.log"
        with log_file.open("ab") as out:
            proc = subprocess.Popen(
                self.argv(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._setup_env(self.env(env)),
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def log(self, label: str) -> str:
        """What a process started with :meth:`spawn` printed so far."""
        path = self.logs / f"{self.name}-{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` here to its end; its output."""
        done = subprocess.run(
            self.argv(command),
            env=self._setup_env(self.env(env)),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
            start_new_session=True,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{self.name}: {shlex.join(command)[:200]} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def python(self, code: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` here (this interpreter)."""
        return self.run([sys.executable, "-c", code], **kw)  # type: ignore[arg-type]

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        """Stop one process this host started (its process group, by its PID)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    # ---------------------------------------------------------------- faults

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ip`` inside this host's network namespace."""
        return sh("ip", "-n", self.netns, *args, check=check)

    def link(self, up: bool) -> None:
        """Plug or unplug the host's cable (its ``eth0``: immediate errors on both sides)."""
        self.ip("link", "set", "eth0", "up" if up else "down")

    def drop(self, on: bool) -> None:
        """Silently drop every packet the host sends or receives on ``eth0`` (iptables
        in its namespace: connections just hang), or stop dropping."""
        for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
            rule = [chain, way, "eth0", "-j", "DROP"]
            if on:
                self.iptables("-A", *rule)
            else:
                self.iptables("-D", *rule, check=False)

    def iptables(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``iptables`` inside this host's network namespace."""
        return sh("ip", "netns", "exec", self.netns, "iptables", "-w", *args, check=check)

    def sysctl(self, key: str, value: str) -> None:
        """Set a per-namespace sysctl (``net.*``) on this host."""
        sh("ip", "netns", "exec", self.netns, "sysctl", "-q", "-w", f"{key}={value}")

    def limit(self, rate: str | None) -> None:
        """Limit the host's link to ``rate`` (e.g. ``"200mbit"``) both ways with ``tc
        tbf`` (egress of its ``eth0`` and of its bridge port), or lift the limit."""
        for ns, dev in ((self.netns, "eth0"), (self.switch, self.port)):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if rate is not None:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                   "tbf", "rate", rate, "burst", "256kb", "latency", "200ms")  # fmt: skip


class Hosts:
    """N hosts on one bridge; a context manager that tears everything down.

    ``with Hosts(["ctl", "w1", "w2", "laptop"]) as hosts: hosts["w1"].run([...])``
    """

    def __init__(self, names: Sequence[str] = DEFAULT_HOSTS, base: Path | None = None) -> None:
        if len(set(names)) != len(names) or not names:
            raise ValueError("host names must be distinct")
        self.names = list(names)
        self.tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.switch = f"glh{self.tag}-sw"
        parent = base or Path("/var/tmp" if Path("/var/tmp").is_dir() else tempfile.gettempdir())
        self.root = Path(tempfile.mkdtemp(prefix="gl-hosts-", dir=parent))
        self.hosts: dict[str, Host] = {}
        self._record = STATE_DIR / f"{self.tag}.json"
        self._started = False

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Hosts:
        """Clean stale harnesses, put up the guard, make the bridge and the hosts."""
        why = missing()
        if why:
            raise RuntimeError(why)
        clean_stale()
        with _state_lock():
            if not guard_present():
                sh("ip", "route", "add", "blackhole", SUBNET)
            self._write_record()
        self._started = True
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_record(self) -> None:
        import psutil

        namespaces = [self.switch] + [f"glh{self.tag}-{n}" for n in self.names]
        rec = {
            "tag": self.tag,
            "pid": os.getpid(),
            "started": psutil.Process().create_time(),
            "netns": namespaces,
            "root": str(self.root),
        }
        self._record.write_text(json.dumps(rec))

    def _build(self) -> None:
        self.root.chmod(0o755)  # a host's task user walks through to its folders
        view, hosts_dir, logs = self.root / "view", self.root / "hosts", self.root / "logs"
        for d in (view, hosts_dir, logs):
            d.mkdir(mode=0o755)
        private_tmp = not any(
            _under(p, Path("/tmp"))
            for p in (Path.cwd(), Path(sys.prefix), Path(os.path.realpath(sys.executable)))
        )
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns, port = f"glh{self.tag}-{name}", f"p{i}"
            own = hosts_dir / name
            for sub in ("home", "tmp"):
                (own / sub).mkdir(parents=True)
            own.chmod(0o755)
            (own / "tmp").chmod(0o1777)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", "name", "eth0", "netns", ns, "type", "veth",
               "peer", "name", port, "netns", self.switch)  # fmt: skip
            sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            address = f"{PREFIX}{FIRST_ADDRESS + i}"
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.hosts[name] = Host(
                name=name, address=address, netns=ns, port=port, switch=self.switch,
                own=own, view=view, hosts_dir=hosts_dir, private_tmp=private_tmp, logs=logs,
            )  # fmt: skip

    def stop(self) -> None:
        """Stop every process (by PID), remove the namespaces, the folders and, when it
        was the last harness, the guard. Safe to call twice."""
        if not self._started:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for host in self.hosts.values():
            for proc in host.procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if keep := os.environ.get("GPULAYER_HOSTS_KEEP_LOGS"):
            shutil.copytree(self.root / "logs", Path(keep) / self.tag, dirs_exist_ok=True)
        with _state_lock():
            _remove(json.loads(self._record.read_text()) if self._record.exists() else
                    {"netns": [self.switch] + [h.netns for h in self.hosts.values()],
                     "root": str(self.root)})  # fmt: skip
            self._record.unlink(missing_ok=True)
            if not any(_alive(int(r["pid"]), float(r["started"])) for _, r in _records()):  # type: ignore[arg-type]
                sh("ip", "route", "del", "blackhole", SUBNET, check=False)
        self._started = False


def _under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder)


# ------------------------------------------------------------------- by hand


def _up(names: list[str]) -> int:
    with Hosts(names) as hosts:
        (STATE_DIR / "current").write_text(hosts.tag)
        for h in hosts:
            print(f"{h.name:8} {h.address:12} netns {h.netns}  folder {h.own}")
        print(f"a shell on a host: python -m tests.hosts.harness shell {names[-1]}")
        print("Ctrl-C tears everything down", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


def _shell(name: str, command: list[str]) -> int:
    tag = (STATE_DIR / "current").read_text().strip()
    rec = json.loads((STATE_DIR / f"{tag}.json").read_text())
    root = Path(rec["root"])
    names = [str(n).removeprefix(f"glh{tag}-") for n in rec["netns"][1:]]
    host = Host(
        name=name, address=f"{PREFIX}{FIRST_ADDRESS + names.index(name)}",
        netns=f"glh{tag}-{name}", port="", switch=rec["netns"][0], own=root / "hosts" / name,
        view=root / "view", hosts_dir=root / "hosts", private_tmp=True, logs=root / "logs",
    )  # fmt: skip
    argv = host.argv(command or [os.environ.get("SHELL", "/bin/bash")])
    os.execvpe(argv[0], argv, host._setup_env({**os.environ, **host.env()}))


def main(argv: list[str] | None = None) -> int:
    """``up`` / ``shell HOST [CMD...]`` / ``down``."""
    parser = argparse.ArgumentParser(prog="python -m tests.hosts.harness")
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up", help="make hosts and keep them until Ctrl-C")
    up.add_argument("--hosts", default=",".join(DEFAULT_HOSTS), help="names, comma-separated")
    shell = sub.add_parser("shell", help="run a shell (or CMD) on a host of the running `up`")
    shell.add_argument("host")
    shell.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("down", help="remove hosts left by runs that were killed")
    args = parser.parse_args(argv)
    if why := missing():
        print(f"harness: {why}", file=sys.stderr)
        return 2
    if args.verb == "up":
        return _up(args.hosts.split(","))
    if args.verb == "shell":
        return _shell(args.host, args.command)
    removed = clean_stale()
    print(f"removed {len(removed)} stale harness(es){': ' if removed else ''}{' '.join(removed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
