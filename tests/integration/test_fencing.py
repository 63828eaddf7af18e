"""Fencing: a task never outlives its worker (docs/adr/0082-fencing.md).

Real ``gpulayer join`` agents are killed with SIGKILL (or frozen with SIGSTOP) while
their tasks run; every process a task started, those that left its process group
included, is gone within a few seconds, checked with psutil on the pids the task
wrote down.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import gpulayer as gl
from gpulayer.client import cells

from ..support import until

PY = sys.executable
GONE_WITHIN_SECONDS = 5.0


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pids_in(folder: Path, n: int) -> list[int]:
    """The pids the task's processes wrote as ``folder/<anything>`` files, once ``n`` did."""

    def read() -> list[int]:
        found = [p.read_text().split() for p in folder.glob("pid-*")]
        return [int(x) for words in found for x in words if x.isdigit()]

    got = until(lambda: len(read()) >= n and read(), timeout=60, what=f"{n} task pids")
    assert all(alive(p) for p in got), "the task's processes run before the kill"
    return got


def kill_agent(agent: subprocess.Popen) -> None:
    os.kill(agent.pid, signal.SIGKILL)


def all_gone(pids: list[int]) -> None:
    until(
        lambda: not any(alive(p) for p in pids),
        timeout=GONE_WITHIN_SECONDS,
        what=f"task processes {pids} to die with their agent",
    )


#: A task that writes its pid and those of a child that left its process group (its own
#: session, like torchrun's ranks) and of one that stayed, then beats every 0.1 s.
TREE = """
import os, subprocess, sys, time
folder = sys.argv[1]
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
left = subprocess.Popen(sleeper, start_new_session=True)
stayed = subprocess.Popen(sleeper)
with open(os.path.join(folder, "pid-tree"), "w") as f:
    f.write(f"{os.getpid()} {left.pid} {stayed.pid}")
while True:
    with open(os.path.join(folder, "beat"), "w") as f:
        f.write(repr(time.time()))
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """A control plane without workers: each test starts (and kills) its own."""
    from gpulayer.cluster import LocalCluster

    from .conftest import FAST

    with LocalCluster(tmp_path_factory.mktemp("fence"), workers=0, **FAST) as c:
        yield c


def test_kill_9_of_the_agent_takes_a_command_and_its_escaped_children(plane, tmp_path):
    agent = plane.add_worker("cmd-1", slots=2)
    with plane.connection() as conn:
        gl.submit([PY, "-c", TREE, str(tmp_path)], worker="cmd-1", connection=conn)
        pids = pids_in(tmp_path, 3)
        kill_agent(agent)
        all_gone(pids)
        beat = (tmp_path / "beat").read_text()
        time.sleep(0.3)  # a live task would have beaten three times by now
        assert (tmp_path / "beat").read_text() == beat


def test_kill_9_of_the_agent_takes_a_function_call_and_its_warm_runners(plane, tmp_path):
    agent = plane.add_worker("fn-1", slots=2)
    folder = str(tmp_path)

    def hold() -> None:
        import os
        import time

        with open(os.path.join(folder, "pid-call"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)

    with plane.connection() as conn:
        gl.remote(hold, worker="fn-1", connection=conn).spawn()
        [pid] = pids_in(tmp_path, 1)
        runners = [
            p.pid for p in psutil.Process(agent.pid).children() if "worker.runner" in p.cmdline()
        ]
        kill_agent(agent)
        all_gone([pid, *runners])


def test_kill_9_of_the_agent_takes_a_session_kernel_and_its_cell(plane, tmp_path):
    agent = plane.add_worker("cell-1", slots=2)
    source = (
        "import os, subprocess, sys, time\n"
        "left = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True)\n"
        f"open({str(tmp_path / 'pid-cell')!r}, 'w').write(f'{{os.getpid()}} {{left.pid}}')\n"
        "time.sleep(300)"
    )
    with plane.connection() as conn:
        cells.ensure_session(conn, "fenced", worker="cell-1")
        cells.submit(conn, source, session="fenced")
        pids = pids_in(tmp_path, 2)
        kill_agent(agent)
        all_gone(pids)


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_kill_9_of_the_agent_takes_every_rank_of_a_gang(plane, tmp_path, launcher):
    if launcher == "torchrun":
        pytest.importorskip("torch")
    name = f"gang-{launcher}"
    agent = plane.add_worker(name, slots=2)
    rank = (
        "import os, sys, time\n"
        "path = os.path.join(sys.argv[1], 'pid-rank' + os.environ['RANK'])\n"
        "open(path, 'w').write(str(os.getpid()))\n"
        "time.sleep(300)"
    )
    with plane.connection() as conn:
        gl.submit(
            [PY, "-c", rank, str(tmp_path)],
            nproc_per_node=2,
            launcher=launcher,
            worker=name,
            connection=conn,
        )
        ranks = pids_in(tmp_path, 2)
        tree = [p.pid for p in psutil.Process(agent.pid).children(recursive=True)]
        kill_agent(agent)
        all_gone(ranks + tree)


def test_kill_9_of_gpulayer_up_takes_its_control_plane_workers_and_tasks(tmp_path):
    data = tmp_path / "up"
    env = {**os.environ, "GPULAYER_CONFIG": str(tmp_path / "absent.json")}
    argv = [PY, "-m", "gpulayer", "up", "--port", "0", "--data-dir", str(data),
            "--no-save-config"]  # fmt: skip
    from gpulayer.cli.processes import free_port

    argv[argv.index("0")] = str(free_port())
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        url = ""
        assert up.stdout is not None
        for raw in up.stdout:
            if raw.startswith(b"gpulayer is up at "):
                url = raw.decode().split()[-1]
                break
        assert url, "gpulayer up did not come up"
        token = (data / "admin.token").read_text().strip()
        with gl.Connection(url, token) as conn:
            gl.submit([PY, "-c", TREE, str(tmp_path)], connection=conn)
            tasks = pids_in(tmp_path, 3)
        children = [p.pid for p in psutil.Process(up.pid).children(recursive=True)]
        assert len(children) >= 3  # control plane, worker, its supervisor (and runners)
        up.kill()
        up.wait()
        all_gone(children + tasks)
    finally:
        up.kill()
        up.wait()
        if up.stdout is not None:
            up.stdout.close()
