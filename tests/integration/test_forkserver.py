"""`gpulayer up --workers N` forks its workers from one import (ADR 0151): they run
work as `gpulayer join` would, stop and die as they did, and where the fork server
cannot serve the workers start on their own."""

import contextlib
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import gpulayer as gl
from gpulayer import contracts
from gpulayer.cli import cluster as cluster_module
from gpulayer.cli import forks
from gpulayer.cli.cluster import LocalCluster

from .conftest import FAST

pytestmark = pytest.mark.skipif(
    not forks.available(), reason="the fork server needs Linux with pidfds"
)


def _gone(pids: list[int], timeout: float = 30) -> list[int]:
    """The pids still alive (zombies aside) after waiting up to ``timeout``."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_workers_forked_from_one_import_work_and_stop_as_joined_ones(tmp_path: Path) -> None:
    """Both workers of a new data dir are children of one fork server, named in `ps`,
    each runs work; a SIGKILL'd worker reads -9 and a stopped one 0, as from
    subprocess; once the cluster stops the fork server has exited too."""
    with LocalCluster(tmp_path, workers=2, slots=1, **FAST) as cluster:
        pids = [cluster.worker_pid(n) for n in cluster.workers]
        assert None not in pids
        parents = {psutil.Process(pid).ppid() for pid in pids if pid is not None}
        assert len(parents) == 1
        server = psutil.Process(parents.pop())
        assert "gpulayer.forkserver" in " ".join(server.cmdline())
        assert server.ppid() == psutil.Process().pid
        names = sorted(psutil.Process(pid).name() for pid in pids if pid is not None)
        assert names == ["gl-local-1", "gl-local-2"]  # what ps -o comm and top show

        with cluster.connection() as conn:
            # One slot each: two jobs that overlap run on both workers.
            jobs = [conn.submit(contracts.JobSpec(command=["sleep", "1"])) for _ in range(2)]
            done = [conn.wait(job.id, timeout=30) for job in jobs]
            assert [j.state for j in done] == ["succeeded", "succeeded"]
            assert sorted(j.worker_name or "" for j in done) == ["local-1", "local-2"]
            assert gl.remote(lambda x: x + 1, connection=conn).run(1) == 2

        assert cluster.stop_worker("local-2", signal.SIGKILL) == -signal.SIGKILL
        assert cluster.stop_worker("local-1", signal.SIGTERM) == 0
        assert cluster.worker_pid("local-1") is None
        server_pid = server.pid
    assert _gone([server_pid]) == []


def test_a_kill_9_of_the_holder_takes_the_fork_server_and_its_workers(tmp_path: Path) -> None:
    """`kill -9` of the process that holds the cluster (`gpulayer up`) leaves neither
    the fork server nor a worker running."""
    script = textwrap.dedent(f"""
        import os, sys, time
        from gpulayer.cli.cluster import LocalCluster
        c = LocalCluster({str(tmp_path)!r}, workers=2, slots=1).start()
        kids = [p for p in os.popen(f"ps -o pid= --ppid {{os.getpid()}}").read().split()]
        print(" ".join(kids + [str(c.worker_pid(n)) for n in c.workers]), flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 4, line  # control plane, fork server, two workers
        holder.kill()
        holder.wait()
        assert _gone(pids) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_without_a_fork_server_the_workers_start_on_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork server that cannot serve (here: it exits at once) costs nothing but
    speed: each worker starts its own interpreter, and the cluster works."""

    class Broken(forks.ForkServer):
        def __init__(self, log_file: Path, env: dict[str, str], *, cwd: Path) -> None:
            super().__init__(log_file, env, cwd=cwd, argv=[sys.executable, "-c", "pass"])

    monkeypatch.setattr(cluster_module.forks, "ForkServer", Broken)
    with LocalCluster(tmp_path, workers=2, slots=1, **FAST) as cluster:
        pids = [cluster.worker_pid(n) for n in cluster.workers]
        assert all(
            "gpulayer join" in " ".join(psutil.Process(pid).cmdline()).replace("-m ", "")
            for pid in pids
            if pid is not None
        )
        with cluster.connection() as conn:
            assert gl.remote(lambda x: x + 1, connection=conn).run(1) == 2
