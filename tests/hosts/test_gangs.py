"""Gangs across hosts: ``--nodes 2 --nproc-per-node 2`` over w1 and w2 with gloo on the
hosts' network, behind a firewall that lets peers in only on the rendezvous ports and
the ephemeral range the collective backend listens on.

The workers run the printed join lines plus ``--rendezvous-ports 29600-29619`` (and
w2 ``--interface eth0``); each host's ``net.ipv4.ip_local_port_range`` is 30000-30999.
Inbound, each worker host accepts only replies, loopback, and new connections from
the other hosts to 29600-29619 and 30000-30999: a rendezvous port outside the range,
or a rank listening anywhere else, would hang the gang.
"""

import json
import os
import signal
import textwrap
from collections.abc import Iterator

import pytest

from ..support import until
from .conftest import ROOT, WORKERS, Laptop, Plane, join, registered
from .harness import SUBNET, Hosts

pytest.importorskip("torch")

RENDEZVOUS = (29600, 29619)
EPHEMERAL = (30000, 30999)
EXAMPLES = ROOT / "notebooks" / "examples"


def firewall(host) -> None:
    """Peers in only on the rendezvous and ephemeral ports (iptables in the host)."""
    host.sysctl("net.ipv4.ip_local_port_range", f"{EPHEMERAL[0]} {EPHEMERAL[1]}")
    rules = [
        ["-i", "lo", "-j", "ACCEPT"],
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        ["-p", "tcp", "-s", SUBNET, "--dport", f"{RENDEZVOUS[0]}:{RENDEZVOUS[1]}", "-j", "ACCEPT"],
        ["-p", "tcp", "-s", SUBNET, "--dport", f"{EPHEMERAL[0]}:{EPHEMERAL[1]}", "-j", "ACCEPT"],
        ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
    ]
    for rule in rules:
        host.iptables("-A", "INPUT", *rule)


@pytest.fixture(scope="module")
def gang_fleet(gl_hosts: Hosts, gl_fleet: Plane, gl_laptop: Laptop) -> Iterator[Laptop]:
    """The workers again, with narrowed rendezvous ports, behind the firewall."""
    extra = {"w1": ["--rendezvous-ports", "29600-29619"],
             "w2": ["--rendezvous-ports", "29600-29619", "--interface", "eth0"]}  # fmt: skip
    default_range = _ephemeral(gl_hosts["w1"])
    for name in WORKERS:
        host = gl_hosts[name]
        host.stop(gl_fleet.workers[name])
        # Before the worker starts: connections opened before the rules are not tracked.
        firewall(host)
        before = host.log("join").count("registered worker")
        lines = [*gl_fleet.join_lines[:-1], " ".join([gl_fleet.join_lines[-1], *extra[name]])]
        gl_fleet.workers[name] = host.spawn(["sh", "-c", "\n".join(lines)], label="join")
        until(lambda h=host, n=before: registered(h, n + 1), 60, f"{name} to register again")
    gl_laptop.ready()
    yield gl_laptop
    for name in WORKERS:  # back to the workers of the printed lines, without a firewall
        host = gl_hosts[name]
        host.stop(gl_fleet.workers[name])
        host.iptables("-F")
        host.sysctl("net.ipv4.ip_local_port_range", default_range)
        before = host.log("join").count("registered worker")
        join(gl_fleet, host)
        until(lambda h=host, n=before: registered(h, n + 1), 60, f"{name} to register again")
    gl_laptop.ready()


DDP = """
import json, re, sys
import gpulayer as gl

conn = gl.connect()
job = gl.submit(
    [sys.executable, "ddp_train.py", "--epochs", "2"],
    nodes=2, nproc_per_node=2, launcher={launcher!r}, workdir={workdir!r},
    cpus=1, timeout="150s", connection=conn,
).wait(timeout=170)
info = conn.job(job.id)
lines = [(line.rank, line.text) for line in conn.follow_logs(job.id)]
events = [e.reason for e in conn.events(job.id)]
nodes = {{t.node_rank: t.worker_name for t in info.tasks}}
json.dump({{"state": info.state, "reason": info.reason, "nodes": nodes, "lines": lines,
           "events": events}}, sys.stdout)
"""


@pytest.mark.parametrize("launcher", ["torchrun", "direct"])
def test_ddp_across_two_hosts_ends_with_equal_parameters_and_ranked_logs(gang_fleet, launcher):
    code = DDP.format(launcher=launcher, workdir=str(EXAMPLES))
    got = json.loads(gang_fleet.python(code, timeout=200))
    assert got["state"] == "succeeded", got
    assert sorted(got["nodes"].values()) == ["w1", "w2"], got["nodes"]
    sums = {r: t.split()[1] for r, t in got["lines"] if r is not None and t.startswith("checksum")}
    assert sorted(sums) == [0, 1, 2, 3], got["lines"]
    assert len(set(sums.values())) == 1, sums  # DDP kept the four ranks in lockstep
    # Rank 0's worker is the rendezvous, at its own address, on a port of its range.
    placed = next(e for e in got["events"] if e and "rendezvous" in e)
    addr, port = placed.rsplit("rendezvous ", 1)[1].split(":")
    head = "w1" if got["nodes"]["0"] == "w1" else "w2"
    assert addr == f"10.200.0.{11 + WORKERS.index(head)}", placed
    assert RENDEZVOUS[0] <= int(port) <= RENDEZVOUS[1], placed


RANKS = """
import os, socket, time
from pathlib import Path
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print("rank", rank, "on", socket.gethostname(), "ifname", os.environ["GLOO_SOCKET_IFNAME"],
      os.environ["NCCL_SOCKET_IFNAME"], flush=True)
Path(os.environ["HOST_TMP"], f"rank{rank}.pid").write_text(str(os.getpid()))
while True:
    dist.all_reduce(__import__("torch").ones(1))
    time.sleep(0.05)
"""

FAILING = """
import json, sys, time
import gpulayer as gl

conn = gl.connect()
job = gl.submit([sys.executable, "-c", {code!r}], nodes=2, nproc_per_node=2,
                launcher="direct", timeout="150s", env={{"HOST_TMP": {tmp!r}}},
                connection=conn)
print(job.id, flush=True)
info = conn.wait(job.id, timeout=170)
tasks = {{t.worker_name: [t.state, t.reason] for t in info.tasks}}
lines = [(line.rank, line.text) for line in conn.follow_logs(job.id)]
json.dump({{"state": info.state, "reason": info.reason, "tasks": tasks, "lines": lines}},
          sys.stdout)
"""


def test_a_rank_killed_on_one_host_stops_the_gang_on_both(gl_hosts, gang_fleet):
    laptop = gang_fleet.host
    for name in WORKERS:
        for rank in range(4):
            gl_hosts[name].outside(gl_hosts[name].tmp / f"rank{rank}.pid").unlink(missing_ok=True)
    code = FAILING.format(code=textwrap.dedent(RANKS), tmp=str(laptop.tmp))
    proc = laptop.spawn(["python", "-c", code], label="failing", env=gang_fleet.env)
    pids = {}

    def all_running() -> bool:
        for name in WORKERS:
            for rank in range(4):
                f = gl_hosts[name].outside(gl_hosts[name].tmp / f"rank{rank}.pid")
                if f.exists() and f.read_text():
                    pids[rank] = (name, int(f.read_text()))
        return len(pids) == 4

    until(all_running, 120, "four ranks on two hosts in their all_reduce loop")
    name, pid = pids[3]
    os.kill(pid, signal.SIGKILL)  # rank 3 dies on its host
    assert proc.wait(timeout=60) == 0, laptop.log("failing")
    got = json.loads(laptop.log("failing").splitlines()[-1])
    assert got["state"] == "failed", got
    assert "rank 3 failed" in got["reason"] and name in got["reason"], got["reason"]
    other = "w1" if name == "w2" else "w2"
    assert got["tasks"][other][0] == "cancelled", got["tasks"]  # the other host's node stopped

    def gone() -> bool:
        return not any(_alive(p) for _, p in pids.values())

    until(gone, 30, "every rank on both hosts to be gone")
    ifnames = [t for r, t in got["lines"] if r is not None and "ifname" in t]
    assert ifnames and all(t.endswith("ifname eth0 eth0") for t in ifnames), ifnames
    hosts = {t.split()[3] for t in ifnames}
    assert hosts == {"w1", "w2"}, ifnames


def _ephemeral(host) -> str:
    """The host's ephemeral port range, as sysctl writes it."""
    return " ".join(host.run(["cat", "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


NOTEBOOK = """
import json, sys
import nbformat
from nbclient import NotebookClient

nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(s) for s in {cells!r}]
NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=180).execute()
json.dump([["".join(o.get("text", "") or o.get("evalue", "")) for o in c.outputs]
           for c in nb.cells], sys.stdout)
"""

REMOTE = """
import gpulayer as gl
gl.connect()

@gl.remote(nodes=2, launcher="torchrun", env={"OMP_NUM_THREADS": "1"}, timeout="150s")
def hosts_of_ranks():
    import socket
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    dist.destroy_process_group()
    return names

print(hosts_of_ranks.run())
"""

MAGIC = """%%gpulayer --nodes 2 --launcher direct
import socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("rank", dist.get_rank(), "on", socket.gethostname(), "sum", t.item())
dist.destroy_process_group()
"""


def test_remote_functions_and_cells_with_nodes_span_both_hosts(gang_fleet):
    code = NOTEBOOK.format(cells=[REMOTE, "%load_ext gpulayer", MAGIC])
    outs = json.loads(gang_fleet.python(code, timeout=240))
    remote, _, magic = ("".join(o) for o in outs)
    assert "['w1', 'w2']" in remote or "['w2', 'w1']" in remote, outs
    assert "rank 0 on w" in magic and "rank 1 on w" in magic, outs
    assert "sum 3.0" in magic, outs
    on = {line.split(" on ")[1].split()[0] for line in magic.splitlines() if " on w" in line}
    assert on == {"w1", "w2"}, magic
