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

import httpx
import psutil
import pytest

import gpulayer as gl
from gpulayer.client import cells

from ..chaos.harness import alive
from ..support import Proxy, until

PY = sys.executable
GONE_WITHIN_SECONDS = 5.0


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
with open(os.path.join(folder, "cwd"), "w") as f:
    f.write(os.getcwd())
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


def test_kill_9_of_the_agent_takes_a_command_and_its_escaped_children_and_folders(plane, tmp_path):
    agent = plane.add_worker("cmd-1", slots=2)
    with plane.connection() as conn:
        gl.submit([PY, "-c", TREE, str(tmp_path)], worker="cmd-1", connection=conn)
        pids = pids_in(tmp_path, 3)
        tasks_root = Path((tmp_path / "cwd").read_text()).parent.parent  # <root>/<task>/work
        assert tasks_root.name.startswith("gpulayer-tasks-cmd-1-") and tasks_root.is_dir()
        kill_agent(agent)
        all_gone(pids)
        beat = (tmp_path / "beat").read_text()
        time.sleep(0.3)  # a live task would have beaten three times by now
        assert (tmp_path / "beat").read_text() == beat
        # The agent could not clean up after itself: its supervisor did.
        until(lambda: not tasks_root.exists(), GONE_WITHIN_SECONDS, "the task folders removed")


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
        [connection_file] = [a for a in psutil.Process(pids[0]).cmdline() if a.endswith(".json")]
        kernel_dir = Path(connection_file).parent  # the kernel's connection files
        assert kernel_dir.name.startswith("glk-")
        kill_agent(agent)
        all_gone(pids)
        until(lambda: not kernel_dir.exists(), GONE_WITHIN_SECONDS, "the kernel's folder removed")


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
            "--no-save-config", "--heartbeat-seconds", "0.5", "--lease-seconds", "3"]  # fmt: skip
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
        # The timings given to `up` are the control plane's, and workers hear them.
        probe = {"name": "probe", "hostname": "probe", "cpus": 1, "memory_bytes": 1 << 30,
                 "version": "test"}  # fmt: skip
        join = (data / "join.token").read_text().strip()
        answer = httpx.post(
            url + "gpulayer/api/v1/workers/register",
            json=probe,
            headers={"Authorization": f"Bearer {join}"},
        ).json()
        assert (answer["heartbeat_seconds"], answer["lease_seconds"]) == (0.5, 3.0)
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


# ------------------------------------------------- a worker that cannot renew its lease

#: Attempt 1 runs for a minute, a retry for a moment; each writes when it started and
#: beats every 0.1 s, and appends its attempt to ``done`` when it finishes (the side
#: effect that must happen once).
ATTEMPT = """
import os, sys, time
folder, attempt = sys.argv[1], os.environ["GPULAYER_ATTEMPT"]
def write(name, text):  # whole or not at all: a kill may land mid-write
    path, part = os.path.join(folder, name), os.path.join(folder, "." + name)
    with open(part, "w") as f:
        f.write(text)
    os.replace(part, path)
write(f"start-{attempt}", repr(time.time()))
write(f"pid-{attempt}", str(os.getpid()))
end = time.time() + (60 if attempt == "1" else 0.5)
while time.time() < end:
    write(f"beat-{attempt}", repr(time.time()))
    time.sleep(0.1)
with open(os.path.join(folder, "done"), "a") as f:
    f.write(attempt + "\\n")
"""


def assert_no_overlap(folder: Path, job) -> None:
    """The retry started after the first attempt's last beat, and finished once."""
    assert job.state == "succeeded", job.info.reason
    last_beat_1 = float((folder / "beat-1").read_text())
    start_2 = float((folder / "start-2").read_text())
    assert last_beat_1 < start_2, f"attempt 1 beat {last_beat_1 - start_2:.2f}s into the retry"
    assert (folder / "done").read_text() == "2\n"
    assert not alive(int((folder / "pid-1").read_text()))


def test_a_frozen_agents_task_is_killed_before_its_retry_starts(fresh_cluster, tmp_path):
    c = fresh_cluster(workers=0)
    frozen = c.add_worker("frozen", slots=1)
    with c.connection() as conn:
        job = gl.submit([PY, "-c", ATTEMPT, str(tmp_path)], retries=1, connection=conn)
        until(lambda: (tmp_path / "beat-1").exists(), timeout=60, what="attempt 1 to run")
        c.add_worker("spare", slots=1)
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            job.wait(timeout=90)
            assert_no_overlap(tmp_path, job)
            tasks = [(t.attempt, t.state, t.worker_name) for t in conn.job(job.id).tasks]
            assert tasks == [(1, "lost", "frozen"), (2, "succeeded", "spare")]
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        # Thawed, it comes back; its late report of attempt 1 changes nothing.
        until(
            lambda: {w.name: w.state for w in conn.workers()}["frozen"] == "ready",
            timeout=30,
            what="the thawed worker to be ready again",
        )
        assert conn.job(job.id).state == "succeeded"
        assert (tmp_path / "done").read_text() == "2\n"


def test_a_worker_cut_off_from_the_control_plane_stops_its_task_before_the_retry(
    fresh_cluster, tmp_path
):
    c = fresh_cluster(workers=0)
    proxy = Proxy(c.port)
    proxy.start()
    url = c.url.replace(f":{c.port}/", f":{proxy.port}/")
    env = {**os.environ, "GPULAYER_JOIN_TOKEN": c.join_token}
    log_file = tmp_path / "cut.log"
    argv = [PY, "-m", "gpulayer", "join", url, "--name", "cut", "--slots", "1",
            "--data-dir", str(tmp_path / "cut")]  # fmt: skip
    with log_file.open("wb") as out:
        cut = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    folder = tmp_path / "files"
    folder.mkdir()
    folder.chmod(0o777)  # the task user writes its beats here
    try:
        c.wait_for_workers(["cut"])
        with c.connection() as conn:
            job = gl.submit([PY, "-c", ATTEMPT, str(folder)], retries=1, connection=conn)
            until(lambda: (folder / "beat-1").exists(), timeout=60, what="attempt 1 to run")
            c.add_worker("spare", slots=1)
            proxy.cut()
            job.wait(timeout=90)
            assert_no_overlap(folder, job)
            assert "no heartbeat answered" in log_file.read_text()
            # The partition heals: the worker registers again and is back in service.
            proxy.start()
            until(
                lambda: {w.name: w.state for w in conn.workers()}["cut"] == "ready",
                timeout=30,
                what="the worker to come back",
            )
            assert conn.job(job.id).state == "succeeded"
            assert (folder / "done").read_text() == "2\n"
    finally:
        cut.terminate()
        cut.wait(30)
        proxy.cut()


@pytest.fixture
def tmp_path(gl_shared_dir: Path) -> Path:
    """Tasks here leave files for the test (pids, beats, ledgers, gates): a folder
    the task user can write (``gl_shared_dir``), not pytest's 0700 ``tmp_path``."""
    return gl_shared_dir
