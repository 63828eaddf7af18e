"""Hardware-aware scheduling with real workers that have simulated GPUs."""

import os
import subprocess
import sys

import gpulayer.client as gl
from gpulayer import contracts

from ..support import until

PY = sys.executable


def hold(marker, *, print_env=True) -> list[str]:
    """A job that prints its GPU reservation, then waits until ``marker`` exists."""
    code = (
        "import os, time\n"
        + ("print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['HIP_VISIBLE_DEVICES'],"
           " flush=True)\n" if print_env else "")
        + f"while not os.path.exists({str(marker)!r}): time.sleep(0.02)\n"
    )  # fmt: skip
    return [PY, "-c", code]


def printed(conn, job) -> list[str]:
    """What ``job`` wrote to its stdout so far (gpulayer's own system lines left out)."""
    page = conn.logs(job.id)
    return [line.text for line in page.lines if line.stream == contracts.LogStream.stdout]


def test_one_gpu_jobs_share_a_two_gpu_worker_and_a_two_gpu_job_waits_its_turn(
    fresh_cluster, gl_shared_dir
):
    c = fresh_cluster(workers=1, slots=4, simulated_gpus="2xA100-80GB")
    go = gl_shared_dir / "go"
    with c.connection() as conn:
        a = gl.submit(hold(go), gpus=1, connection=conn)
        b = gl.submit(hold(go), gpus=1, connection=conn)
        # Each job's own line (its stdout), not the "started on ..." system line before it.
        until(lambda: printed(conn, a) and printed(conn, b), what="both 1-GPU jobs to print")
        seen = sorted(printed(conn, a) + printed(conn, b))
        assert seen == ["0 0", "1 1"]  # concurrently, on different GPUs
        big = gl.submit(
            [PY, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
            gpus=2,
            connection=conn,
        )
        waiting = conn.job(big.id)
        assert waiting.state == "queued"
        [reason] = waiting.pending_reasons
        assert reason.startswith("local-1: needs 2 × GPU, has 0 free (GPU 0 busy with job ")
        env = {**os.environ, "GPULAYER_URL": c.url, "GPULAYER_TOKEN": c.admin_token}
        out = subprocess.run(
            [PY, "-m", "gpulayer", "explain", big.id],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f"job {big.id} is queued: waiting for a worker to free up" in out.stdout
        assert "GPU 1 busy with job" in out.stdout
        go.write_text("go")
        big.wait(timeout=30)
        assert big.state == "succeeded" and "0,1" in big.logs()
        assert conn.placement(big.id).summary == "ran on local-1 (GPUs 0,1)"


def test_requirements_pick_the_matching_worker_and_impossible_ones_are_flagged(fresh_cluster):
    c = fresh_cluster(workers=0)
    c.add_worker("t4box", simulated_gpus="1xT4-16GB")
    c.add_worker("h100box", simulated_gpus="1xH100-80GB")
    with c.connection() as conn:
        j = gl.submit(["true"], gpus=1, min_compute_capability="8.0", connection=conn)
        assert j.wait(timeout=30).info.worker_name == "h100box"
        j = gl.submit(["true"], gpus=1, gpu_model="T4", connection=conn)
        assert j.wait(timeout=30).info.worker_name == "t4box"
        j = gl.submit(["true"], gpus=1, gpu_memory="96GiB", connection=conn)
        info = conn.job(j.id)
        assert info.state == "queued"
        assert info.reason == "unsatisfiable: no registered worker could ever run this job"
        assert sorted(info.pending_reasons) == [
            "h100box: needs 1 × GPU ≥ 96 GiB, only 0 of its 1 GPU match",
            "t4box: needs 1 × GPU ≥ 96 GiB, only 0 of its 1 GPU match",
        ]
        placement = conn.placement(j.id)
        assert not placement.satisfiable and not any(w.could_ever_fit for w in placement.workers)
        j.cancel()


def test_a_drained_worker_finishes_its_task_and_takes_no_new_one(fresh_cluster, gl_shared_dir):
    c = fresh_cluster(workers=1, slots=2)
    go = gl_shared_dir / "go"
    env = {**os.environ, "GPULAYER_URL": c.url, "GPULAYER_TOKEN": c.admin_token}
    with c.connection() as conn:
        running = gl.submit(hold(go, print_env=False), connection=conn)
        until(lambda: conn.job(running.id).state == "running", what="the job to run")
        out = subprocess.run(
            [PY, "-m", "gpulayer", "drain", "local-1"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert out.stdout.strip() == "worker local-1 is draining; 1 task(s) still running"
        later = gl.submit(["true"], connection=conn)
        assert conn.job(later.id).pending_reasons == ["local-1: draining: takes no new tasks"]
        go.write_text("go")
        assert running.wait(timeout=30).state == "succeeded"
        assert conn.job(later.id).state == "queued"
        subprocess.run(
            [PY, "-m", "gpulayer", "resume", "local-1"],
            check=True,
            env=env,
            capture_output=True,
            timeout=60,
        )
        assert later.wait(timeout=30).state == "succeeded"


def test_heartbeats_carry_telemetry_of_gpus_and_running_tasks(fresh_cluster, gl_shared_dir):
    c = fresh_cluster(workers=1, simulated_gpus="2xA100-80GB")
    go = gl_shared_dir / "go"
    with c.connection() as conn:
        job = gl.submit(hold(go, print_env=False), connection=conn)
        until(lambda: conn.job(job.id).state == "running", what="the job to run")
        [t] = conn.job(job.id).tasks

        def task_sample():
            samples = conn.telemetry("local-1").samples
            return next((s for s in reversed(samples) for x in s.tasks
                         if x.task_id == t.id and x.rss_bytes > 0), None)  # fmt: skip

        sample = until(task_sample, what="a heartbeat with the task's process tree")
        assert [g.index for g in sample.gpus] == [0, 1]
        assert sample.cpu_percent is not None and sample.memory_used_bytes > 0
        [w] = conn.workers()
        assert [d.compute_capability for d in w.devices] == ["8.0", "8.0"]
        assert all(d.simulated for d in w.devices)
        go.write_text("go")
        job.wait(timeout=30)
