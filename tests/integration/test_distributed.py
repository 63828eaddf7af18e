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
from gpulayer import errors

from ..support import until
from .conftest import kernel_env, notebook, outputs, run, stdout

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
        # faulthandler: a rank that aborts leaves its Python stacks in the job's log
        env={"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **(env or {})},
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


def test_killing_one_rank_fails_the_gang_fast_and_frees_every_worker(fresh_cluster, gl_shared_dir):
    cluster = fresh_cluster(workers=2, slots=1)
    with cluster.connection() as conn:
        env = {"DDP_PID_DIR": str(gl_shared_dir)}
        job = ddp_job(conn, "--epochs", "1", "--hold", "120", env=env)
        pid_file = gl_shared_dir / "rank3.pid"
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


def all_reduce_ranks(scale):
    """Every rank adds its rank + 1 over gloo; answers what this rank saw."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        t = torch.tensor([float(dist.get_rank() + 1) * scale])
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} sums {t.item():g}")
        return dist.get_rank(), dist.get_world_size(), t.item()
    finally:
        dist.destroy_process_group()


def rank_one_refuses():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank 1 says no")
    dist.barrier()  # rank 0 waits here until the gang is stopped
    return "unreachable"


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_a_remote_function_runs_on_every_rank_and_answers_rank_0s_value(
    fresh_cluster, capsys, launcher
):
    cluster = fresh_cluster(workers=2, slots=1)
    with cluster.connection() as conn:
        fn = gl.remote(
            all_reduce_ranks,
            nodes=2,
            launcher=launcher,
            env={"OMP_NUM_THREADS": "1"},
            timeout="120s",
            connection=conn,
        )
        assert fn.run(2.0) == (0, 2, 6.0)  # (1 + 2) * 2 on both ranks; rank 0's tuple returns
        out = capsys.readouterr().out
        assert "[0] rank 0 of 2 sums 6" in out
        assert "[1] rank 1 of 2 sums 6" in out  # the other node's print, with its rank
        # .map runs one gang per item.
        assert list(fn.map([1.0, 3.0], progress=False)) == [(0, 2, 3.0), (0, 2, 9.0)]


def test_a_rank_that_raises_fails_the_call_with_its_exception_and_no_retry(fresh_cluster):
    cluster = fresh_cluster(workers=1, slots=1)
    with cluster.connection() as conn:
        fn = gl.remote(
            rank_one_refuses,
            nproc_per_node=2,
            retries=2,
            env={"OMP_NUM_THREADS": "1"},
            timeout="120s",
            connection=conn,
        )
        call = fn.spawn()
        with pytest.raises(ValueError, match="rank 1 says no") as raised:
            call.result(timeout=120)
        assert "rank_one_refuses" in str(raised.value.__cause__)  # the remote traceback
        info = conn.job(call.id)
        assert info.state == "failed"
        assert "rank 1 failed" in (info.reason or ""), info.reason
        assert info.attempts == 1  # the function's exception is its answer, not a crash


def test_distributed_options_are_checked_where_they_are_given():
    with pytest.raises(errors.ValidationError, match="nodes"):
        gl.remote(all_reduce_ranks, nodes=0)
    fn = gl.remote(all_reduce_ranks, nodes=2)
    with pytest.raises(ValueError, match="chunk_size"):
        fn.map([1.0], chunk_size=4)


MAGIC_CELL = """\
%%gpulayer --nodes 2 --launcher direct --push scale --pull total,world
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1) * scale])
dist.all_reduce(t)
total, world = t.item(), dist.get_world_size()
print(f"rank {dist.get_rank()} total {total:g}")
dist.destroy_process_group()
"""


def test_a_cell_magic_with_nodes_runs_the_cell_on_every_rank(fresh_cluster, tmp_path):
    cluster = fresh_cluster(workers=2, slots=1)
    nb = notebook(
        "%load_ext gpulayer",
        "scale = 5.0",
        MAGIC_CELL,
        "print(total, world)",
        "%%gpulayer --nproc-per-node 2 --launcher direct\n"
        "import os\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise KeyError('no rank 1 today')\n",
    )
    env = {**kernel_env(cluster, tmp_path), "OMP_NUM_THREADS": "1"}
    run(nb, env)
    gang = nb.cells[2]
    assert not outputs(gang, "error"), outputs(gang, "error")
    out = stdout(gang)
    assert "[0] rank 0 total 15" in out and "[1] rank 1 total 15" in out, out
    assert stdout(nb.cells[3]).split() == ["15.0", "2"]  # rank 0's variables came back
    (error,) = outputs(nb.cells[4], "error")
    assert error.ename == "KeyError" and "no rank 1 today" in error.evalue
