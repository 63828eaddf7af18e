"""Fixtures for tests across hosts: one set of hosts, a control plane started with
``gpulayer up --host <its address>`` on ``ctl``, and workers on ``w1`` and ``w2`` that
joined with the lines ``up`` printed, copied as they are.

The test process (the root network namespace) never talks to a host's address:
everything a user would do runs on the ``laptop`` host (:class:`Laptop`), and tests
read what it printed. The hosts, the control plane and the workers are shared by
the whole session; a test that breaks something (a link, a firewall) mends it and
waits for the fleet before it ends.
"""

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..support import skip_folder, until
from .harness import Host, Hosts, missing

#: Short timings, so partitions longer than the lease take seconds.
HEARTBEAT_SECONDS = 0.5
LEASE_SECONDS = 5.0
ROOT = Path(__file__).parents[2]
WORKERS = ("w1", "w2")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip every test here, with the reason, where hosts cannot be made."""
    skip_folder(items, Path(__file__).parent, missing())


@pytest.fixture(scope="session")
def gl_hosts() -> Iterator[Hosts]:
    """ctl (10.200.0.10), w1, w2 and laptop on one bridge."""
    with Hosts(["ctl", *WORKERS, "laptop"]) as hosts:
        yield hosts


@dataclass
class Plane:
    """The control plane ``gpulayer up`` started on ctl, and what it printed."""

    host: Host
    proc: subprocess.Popen[bytes]
    printed: str
    url: str
    fingerprint: str
    join_lines: list[str]
    data_dir: Path  # as ctl sees it
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


def read_up(printed: str) -> tuple[str, str, list[str], Path]:
    """URL, pin, the two join lines and the data dir from ``gpulayer up``'s output."""
    url = re.search(r"^control plane:\s+(\S+)$", printed, re.M)
    pin = re.search(r"^TLS certificate:\s+(\S+)$", printed, re.M)
    token_file = re.search(r"^admin token:\s+(\S+)$", printed, re.M)
    lines = printed.splitlines()
    at = lines.index("join from another machine:")
    join = [line.strip() for line in lines[at + 1 : at + 3]]
    assert url and pin and token_file, printed
    return url.group(1), pin.group(1), join, Path(token_file.group(1)).parent


@pytest.fixture(scope="session")
def gl_plane(gl_hosts: Hosts) -> Plane:
    """``gpulayer up --host 10.200.0.10 --local-workers 0`` on ctl, with short timings."""
    ctl = gl_hosts["ctl"]
    timings = ["--heartbeat-seconds", str(HEARTBEAT_SECONDS), "--lease-seconds", str(LEASE_SECONDS)]
    argv = ["gpulayer", "up", "--host", ctl.address, "--local-workers", "0", *timings]
    proc = ctl.spawn(argv, label="up")
    until(
        lambda: "gpulayer is up at" in ctl.log("up") or proc.poll() is not None,
        90,
        "gpulayer up on ctl",
    )
    assert proc.poll() is None, ctl.log("up")
    url, pin, join, data_dir = read_up(ctl.log("up"))
    return Plane(ctl, proc, ctl.log("up"), url, pin, join, data_dir)


def join(plane: Plane, host: Host, extra_env: Mapping[str, str] | None = None) -> None:
    """Run, on ``host``, the join lines ``up`` printed, exactly as printed."""
    script = "\n".join(plane.join_lines)
    plane.workers[host.name] = host.spawn(["sh", "-c", script], label="join", env=extra_env)


def registered(host: Host, times: int = 1) -> bool:
    """Whether the worker on ``host`` has registered ``times`` times (its log says so)."""
    return host.log("join").count(f"registered worker {host.name} as") >= times


@pytest.fixture(scope="session")
def gl_fleet(gl_hosts: Hosts, gl_plane: Plane) -> Plane:
    """Workers on w1 and w2, joined with the printed lines."""
    for name in WORKERS:
        join(gl_plane, gl_hosts[name])
    for name in WORKERS:
        until(lambda n=name: registered(gl_hosts[n]), 60, f"the worker on {name} to register")
    return gl_plane


class Laptop:
    """The user's machine: Python and the ``gpulayer`` CLI against the control plane,
    with a user token minted on ctl (as a person would copy it)."""

    def __init__(self, host: Host, plane: Plane, token: str) -> None:
        self.host = host
        self.plane = plane
        self.token = token

    @property
    def env(self) -> dict[str, str]:
        """``GPULAYER_URL``, ``GPULAYER_TOKEN``, ``GPULAYER_FINGERPRINT``; no saved config."""
        return {
            "GPULAYER_URL": self.plane.url,
            "GPULAYER_TOKEN": self.token,
            "GPULAYER_FINGERPRINT": self.plane.fingerprint,
            "OMP_NUM_THREADS": "1",
        }

    def python(self, code: str, *, timeout: float = 120, check: bool = True) -> str:
        """Run ``code`` on the laptop; its stdout (fails the test on a non-zero exit)."""
        done = self.host.run([sys.executable, "-c", code], env=self.env, timeout=timeout,
                             check=check)  # fmt: skip
        return done.stdout

    def cli(self, *args: str, timeout: float = 120) -> str:
        """``gpulayer ARGS`` on the laptop; its stdout (fails the test on an error)."""
        return self.cli_run(*args, timeout=timeout, check=True).stdout

    def cli_run(
        self, *args: str, timeout: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``gpulayer ARGS`` on the laptop, to its end."""
        return self.host.run(["gpulayer", *args], env=self.env, timeout=timeout, check=check)

    def workers(self) -> dict[str, dict]:
        """``gpulayer workers -o json`` by name."""
        return {w["name"]: w for w in json.loads(self.cli("workers", "-o", "json"))["workers"]}

    def ready(self, *names: str, timeout: float = 60) -> dict[str, dict]:
        """Wait until the workers ``names`` are ready (per ``gpulayer workers``)."""
        names = names or WORKERS
        found: dict[str, dict] = {}

        def check() -> bool:
            found.update(self.workers())
            return all(found.get(n, {}).get("state") == "ready" for n in names)

        until(check, timeout, f"workers {', '.join(names)} ready")
        return found


@pytest.fixture(scope="session")
def gl_laptop(gl_hosts: Hosts, gl_fleet: Plane) -> Laptop:
    """The laptop, with a user token minted on ctl (``gpulayer token create``)."""
    minted = gl_fleet.host.run(["gpulayer", "token", "create", "laptop", "--role", "submitter"])
    return Laptop(gl_hosts["laptop"], gl_fleet, minted.stdout.strip())


@pytest.fixture
def gl_mend(gl_hosts: Hosts, gl_laptop: Laptop) -> Iterator[None]:
    """After a test that breaks links or firewalls: every link up, no rule, no limit,
    and both workers ready again."""
    yield
    for host in gl_hosts:
        host.link(True)
        host.iptables("-F", check=False)
        host.limit(None)
    started = time.monotonic()
    gl_laptop.ready(timeout=60)
    assert time.monotonic() - started < 60
