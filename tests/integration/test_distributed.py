"""Distributed jobs end to end: two real workers, torchrun, gloo on CPU.

A 2-node × 2-process DDP run of ``notebooks/examples/ddp_train.py`` across two
``gpulayer join`` subprocesses: every rank ends with the same parameters, every
line carries its rank, rank 0's training metrics reach the control plane, and a
killed rank fails the whole gang fast and frees both workers.
"""

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

import gpulayer as gl

from .conftest import until

pytest.importorskip("torch")

EXAMPLES = Path(__file__).parents[2] / "notebooks" / "examples"
ROOT = str(Path(__file__).parents[2])


def ddp_job(conn, *args, launcher="torchrun", env=None, timeout="120s"):
    return gl.submit(
        [sys.executable, "ddp_train.py", *args],
        nodes=2,
        nproc_per_node=2,
        launcher=launcher,
        workdir=EXAMPLES,
        env={"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=timeout,
        connection=conn,
    )


@pytest.mark.parametrize("launcher", ["torchrun", "direct"])
def test_a_two_node_ddp_job_trains_in_lockstep_with_ranked_logs_and_metrics(
    fresh_cluster, launcher
):
    cluster = fresh_cluster(workers=2, slots=1)
    with cluster.connection() as conn:
        job = ddp_job(conn, "--epochs", "2", launcher=launcher).wait(timeout=120)
        info = conn.job(job.id)
        assert info.state == "succeeded", (info.reason, job.logs())
        assert sorted(t.node_rank for t in info.tasks) == [0, 1]
        assert len({t.worker_id for t in info.tasks}) == 2
        lines = list(conn.follow_logs(job.id))
        sums = {
            line.rank: m.group(1)
            for line in lines
            if line.rank is not None and (m := re.match(r"checksum (\S+)", line.text))
        }
        assert sorted(sums) == [0, 1, 2, 3]
        assert len(set(sums.values())) == 1, sums  # DDP kept every rank's parameters equal
        points = job.metrics()
        assert points, "rank 0's train/loss reached the control plane"
        steps = [p.step for p in points]
        assert steps == sorted(steps)
        assert all("train/loss" in p.metrics for p in points)
        assert {p.rank for p in points} == {0}


def test_killing_one_rank_fails_the_gang_fast_and_frees_every_worker(fresh_cluster, tmp_path):
    cluster = fresh_cluster(workers=2, slots=1)
    with cluster.connection() as conn:
        job = ddp_job(conn, "--epochs", "1", "--hold", "120", env={"DDP_PID_DIR": str(tmp_path)})
        pid_file = tmp_path / "rank3.pid"
        until(lambda: pid_file.exists() and pid_file.read_text(), 90, "rank 3 to start holding")
        killed = time.monotonic()
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        ended = conn.wait(job.id, timeout=30)
        took = time.monotonic() - killed
        assert ended.state == "failed"
        assert "rank 3 failed" in (ended.reason or ""), ended.reason
        assert "SIGKILL" in (ended.reason or ""), ended.reason
        assert took < 10, f"the gang took {took:.1f}s to fail"
        assert {t.state for t in ended.tasks} == {"failed", "cancelled"}
        # Both workers are free at once: a follow-up gang is placed on both.
        nxt = gl.submit(["true"], nodes=2, launcher="direct", connection=conn)
        assert conn.job(nxt.id).state in ("scheduled", "running", "succeeded")
        assert nxt.wait(timeout=60).state == "succeeded"
