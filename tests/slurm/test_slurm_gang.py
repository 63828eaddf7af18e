"""A gang through Slurm across hosts: ``gpulayer up --local-workers 0 --providers
slurm.toml`` on a login node (``ctl``, which also runs slurmctld), two compute nodes
(``n1``, ``n2``: slurmd, 2 fake GPUs each) and the user's laptop, each a host of
``tests/hosts/harness.py`` (its own network namespace, hostname and folders; only the
Slurm folder is shared, as a cluster's shared file system is).

A 2-node job is ONE 2-node allocation (``sbatch -N2``, one ``srun`` worker per node),
so it gets both nodes or none; its ranks run on n1 and n2 inside that allocation, and
the allocation is cancelled once idle.
"""

import json
from collections.abc import Iterator

import pytest

from ..hosts.conftest import Laptop, Plane, read_up
from ..hosts.harness import Hosts
from ..hosts.harness import missing as hosts_missing
from ..providers.conftest import toml
from ..support import until
from .conftest import slurm_table
from .daemons import Node, SlurmCluster

pytestmark = pytest.mark.skipif(hosts_missing() is not None, reason=str(hosts_missing()))

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def login() -> Iterator[tuple[Hosts, SlurmCluster]]:
    """The hosts, and Slurm on them: slurmctld on ctl, slurmd on n1 and n2."""
    with Hosts(["ctl", *NODES, "laptop"]) as hosts:

        def on(name: str):  # a launcher: the daemon runs on that host
            return lambda argv, label, env: hosts[name].spawn(argv, label=label, env=env)

        ctl = hosts["ctl"]
        nodes = [Node(n, hosts[n].address, n, on(n)) for n in NODES]
        slurm = SlurmCluster(
            nodes, ("ctl", ctl.address), on("ctl"),
            client=lambda argv, env: ctl.run(list(argv), env=env, timeout=30, check=False),
        )  # fmt: skip
        with slurm:
            yield hosts, slurm


@pytest.fixture(scope="module")
def laptop(login: tuple[Hosts, SlurmCluster]) -> Laptop:
    """``gpulayer up --host ctl --local-workers 0 --providers slurm.toml`` on ctl, and
    the laptop with a user token minted there."""
    hosts, slurm = login
    ctl = hosts["ctl"]
    shared = slurm.root / "work"  # on the shared file system: the nodes see the scripts
    shared.mkdir(mode=0o755)
    config = slurm.root / "slurm.toml"
    config.write_text(toml({"hpc": slurm_table(slurm, max_nodes=2, workdir=str(shared))}))
    argv = ["gpulayer", "up", "--host", ctl.address, "--local-workers", "0",
            "--providers", str(config), "--heartbeat-seconds", "0.5",
            "--lease-seconds", "5"]  # fmt: skip
    proc = ctl.spawn(argv, label="up", env=slurm.env)
    until(lambda: "gpulayer is up at" in ctl.log("up") or proc.poll() is not None, 90, "up")
    assert proc.poll() is None, ctl.log("up")
    url, pin, join, data_dir = read_up(ctl.log("up"))
    plane = Plane(ctl, proc, ctl.log("up"), url, pin, join, data_dir)
    minted = ctl.run(["gpulayer", "token", "create", "laptop", "--role", "submitter"])
    return Laptop(hosts["laptop"], plane, minted.stdout.strip())


SHOW = (
    "import os, socket; print(socket.gethostname(), os.environ['SLURM_JOB_ID'],"
    " os.environ['RANK'], os.environ['CUDA_VISIBLE_DEVICES'])"
)
GANG = f"""
import json, sys
import gpulayer as gl
conn = gl.connect()
job = gl.submit([sys.executable, "-c", {SHOW!r}], nodes=2, launcher="direct", gpus=1,
                connection=conn)
job.wait(timeout=150)
print(json.dumps({{
    "job": conn.job(job.id).model_dump(mode="json"),
    "instances": [i.model_dump(mode="json") for i in conn.instances()],
    "out": [ln.text for ln in conn.logs(job.id).lines if ln.stream == "stdout"],
}}))
"""


def test_a_two_node_gang_is_one_two_node_allocation_on_two_slurm_nodes(login, laptop):
    _, slurm = login
    done = json.loads(laptop.python(GANG, timeout=240).splitlines()[-1])
    job, [inst] = done["job"], done["instances"]
    assert job["state"] == "succeeded", done
    assert inst["nodes"] == 2 and inst["job_ids"] == [job["id"]]
    allocation = inst["external_id"]
    # one Slurm job holding both nodes ...
    shape = slurm.run("squeue", "-h", "-t", "all", "-j", allocation, "-o", "%D %N").stdout
    assert shape.split() == ["2", "n[1-2]"], shape
    # ... in which each rank ran on its own node, with the one GPU Slurm gave it there
    ranks = sorted(line.split() for line in done["out"])
    assert ranks == [["n1", allocation, "0", "0"], ["n2", allocation, "1", "0"]], done["out"]
    # idle: the whole allocation is cancelled, and its two workers forgotten
    until(lambda: _slurm_state(slurm, allocation) == "CANCELLED", 90, "the idle allocation")
    gone = json.loads(laptop.cli("instances", "-o", "json"))
    assert [i["state"] for i in gone["instances"]] == ["gone"], gone
    assert not [w for w in laptop.workers() if w.startswith("hpc-")]


def _slurm_state(slurm: SlurmCluster, job_id: str) -> str:
    return slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()
