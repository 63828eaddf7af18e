"""The ``slurm`` provider against real Slurm daemons: a control plane with no worker of
its own gets one from Slurm for a GPU job, gives it back when idle, retries a task
whose allocation was cancelled from outside, and says Slurm's own words when Slurm
refuses a request."""

import sys
import time
from pathlib import Path

import pytest

import gpulayer.client as gl
from gpulayer import contracts

from ..support import until
from .daemons import SlurmCluster

PY = sys.executable
SHOW_ALLOCATION = (
    "import os, pwd; print('slurm job', os.environ.get('SLURM_JOB_ID'),"
    " 'gpus', os.environ.get('CUDA_VISIBLE_DEVICES'), 'user', pwd.getpwuid(os.getuid())[0])"
)


def instances(conn, state=None):
    return [i for i in conn.instances() if state is None or i.state == state]


def printed(conn, job_id):
    return [ln.text for ln in conn.logs(job_id).lines if ln.stream == contracts.LogStream.stdout]


def environ_of(marker: str) -> dict[str, str]:
    """The environment of the one process whose command line holds ``marker``."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if marker in cmdline and "gpulayer join" in cmdline.replace("-m ", ""):
                raw = (proc / "environ").read_bytes().decode(errors="replace")
                return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        except OSError:
            continue
    raise AssertionError(f"no process with {marker!r}")


def slurm_state(slurm: SlurmCluster, job_id: str) -> str:
    """What ``squeue`` says of a Slurm job (finished ones too: MinJobAge is long)."""
    return slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()


def test_a_gpu_job_runs_on_a_worker_slurm_started_which_is_cancelled_when_idle(
    gl_slurm, gl_slurm_plane
):
    c = gl_slurm_plane()
    with c.connection() as conn:
        job = gl.submit([PY, "-c", SHOW_ALLOCATION], gpus=1, timeout="45m", connection=conn)
        # explain names the Slurm job, as squeue sees it (pending or started)
        seen = until(
            lambda: (p := conn.job(job.id).provisioning) and p.detail.startswith("slurm job") and p,
            60, "the job to be provisioning on a Slurm job",
        )  # fmt: skip
        assert seen.provider == "hpc"
        assert " in partition gpu" in seen.detail, seen.detail
        job.wait(timeout=120)
        done = conn.job(job.id)
        assert done.state == "succeeded", printed(conn, job.id)
        [inst] = instances(conn)
        slurm_job = inst.external_id
        assert slurm_job and done.worker_name == f"hpc-{inst.id}"
        # the task ran inside that allocation, on the one fake GPU Slurm gave it, as the
        # task user (the allocation is root's here), in the provider's folder
        assert printed(conn, job.id) == [f"slurm job {slurm_job} gpus 0 user gpulayer-task"]
        shown = gl_slurm.run("scontrol", "show", "job", slurm_job).stdout
        assert "WorkDir=" + str(c.data_dir / "providers" / "hpc") in shown
        # the table's time_limit is 30m; the job's timeout 45m: the allocation outlives it
        assert "TimeLimit=00:50:00" in shown
        [worker] = [w for w in conn.workers() if w.name == done.worker_name]
        assert len(worker.devices) == 1  # the node has two; the allocation holds one
        assert worker.labels["slurm_job"] == slurm_job
        gone = until(lambda: instances(conn, "gone"), 90, "the idle instance to be cancelled")
        assert "idle for" in (gone[0].reason or "")
        until(lambda: slurm_state(gl_slurm, slurm_job) == "CANCELLED", 30, "scancel")
        assert not [w for w in conn.workers() if w.name == done.worker_name]


def test_an_allocation_cancelled_from_outside_is_lost_and_its_task_retried_on_a_fresh_one(
    gl_slurm, gl_slurm_plane, gl_shared_dir
):
    c = gl_slurm_plane(idle_timeout=60)
    go = gl_shared_dir / "go"
    wait_for_go = (
        f"import os, time\nprint(os.environ['SLURM_JOB_ID'], flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)"
    )
    with c.connection() as conn:
        job = gl.submit([PY, "-c", wait_for_go], gpus=1, retries=2, connection=conn)
        until(lambda: conn.job(job.id).state == "running", 120, "the job to run")
        [first] = instances(conn)
        # the allocation's environment is the control plane's (its venv, its PYTHONPATH)
        # but for the control plane's own credentials
        env = environ_of(f"--name hpc-{first.id} ")
        assert env["SLURM_JOB_ID"] == first.external_id and "SLURM_CONF" in env
        assert not {"JUPYTER_TOKEN", "GL_JOIN_TOKEN_0"} & env.keys()
        gl_slurm.run("scancel", first.external_id)  # an operator, a preemption
        lost = until(lambda: instances(conn, "lost"), 60, "the instance to be lost")
        assert lost[0].id == first.id
        assert f"slurm job {first.external_id} CANCELLED" in (lost[0].reason or "")
        fresh = until(
            lambda: [i for i in instances(conn) if i.state.active and i.id != first.id],
            60, "a fresh instance for the retry",
        )  # fmt: skip
        assert fresh[0].external_id != first.external_id
        until(lambda: conn.job(job.id).state == "running", 120, "the retry to run")
        go.touch()
        job.wait(timeout=60)
        info = conn.job(job.id)
        assert info.state == "succeeded" and info.attempts == 2
        assert info.worker_name == f"hpc-{fresh[0].id}"


@pytest.mark.parametrize(
    ("ask", "refusal"),
    [
        ({"gpus": 3}, "Requested node configuration is not available"),  # the node has 2
        ({"timeout": "2h"}, "Requested time limit is invalid (missing or exceeds some limit)"),
    ],
    ids=["gpus", "time"],
)
def test_a_request_beyond_the_partitions_limits_is_unsatisfiable_with_slurms_message(
    gl_slurm, gl_slurm_plane, ask, refusal
):
    c = gl_slurm_plane(gpus_per_node=0)  # the table does not know the nodes' size
    with c.connection() as conn:
        job = gl.submit([PY, "-c", "pass"], connection=conn, **{"gpus": 1, **ask})
        info = until(lambda: (j := conn.job(job.id)).unsatisfiable and j, 60, "the refusal")
        assert info.state == "queued"
        explained = conn.placement(job.id)
        assert explained.summary == (
            f"unsatisfiable: slurm: sbatch: error: Batch job submission failed: {refusal}"
        )
        # Refused once: Slurm is not asked again at each tick of the autoscaler (every
        # 0.5 s here; it used to make a failed instance each time). Proving that
        # nothing more happens takes waiting a few ticks.
        time.sleep(1.6)
        [refused] = instances(conn, "failed")
        assert refusal in (refused.reason or "")
        assert len(instances(conn)) == 1


def test_a_worker_whose_allocation_nears_its_end_is_drained_and_new_work_gets_a_fresh_one(
    gl_slurm, gl_slurm_plane, gl_shared_dir
):
    c = gl_slurm_plane(idle_timeout=60)  # drain_before_end: 5m, the default
    go = gl_shared_dir / "go"
    wait_for_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    with c.connection() as conn:
        first = gl.submit([PY, "-c", wait_for_go], gpus=1, connection=conn)
        until(lambda: conn.job(first.id).state == "running", 120, "the first job to run")
        [inst] = instances(conn)
        name = f"hpc-{inst.id}"
        # the allocation now ends in under 4 minutes (an administrator shortened it;
        # or it simply got there): within drain_before_end
        gl_slurm.run("scontrol", "update", f"JobId={inst.external_id}", "TimeLimit=4")
        until(lambda: [w for w in conn.workers() if w.name == name and w.state == "draining"],
              30, "the worker to be drained")  # fmt: skip
        # new work is not placed there: it gets an allocation of its own
        second = gl.submit([PY, "-c", "print('elsewhere')"], gpus=1, connection=conn)
        second.wait(timeout=120)
        assert conn.job(second.id).state == "succeeded"
        assert conn.job(second.id).worker_name not in (None, name)
        # the running task was left alone
        assert conn.job(first.id).state == "running"
        go.touch()
        first.wait(timeout=60)
        done = conn.job(first.id)
        assert done.state == "succeeded" and done.attempts == 1 and done.worker_name == name
