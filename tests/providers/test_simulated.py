"""The autoscaler's lifecycle rules against the ``simulated`` provider: a real control
plane (as ``gpulayer up --providers FILE`` starts it) whose instances are real
``gpulayer join`` processes with simulated GPUs."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx

import gpulayer.client as gl

from ..support import until

PY = sys.executable
A100 = {"name": "a100", "gpus": "1xA100-80GB", "price_per_hour": 3.6, "cpus": 4}


def printed(conn, job_id):
    return [ln for ln in conn.logs(job_id).lines if ln.stream == "stdout"]


def instances(conn, state=None):
    return [i for i in conn.instances() if state is None or i.state == state]


def test_a_gpu_job_on_an_empty_cluster_gets_an_instance_which_is_terminated_when_idle(
    gl_provider_cluster,
):
    c = gl_provider_cluster({"sim": {"kind": "simulated", "idle_timeout": 3, "offers": [A100]}})
    with c.connection() as conn:
        job = gl.submit([PY, "-c", "import time; time.sleep(1.5); print('hi')"], gpus=1,
                        connection=conn)  # fmt: skip
        seen = until(lambda: conn.job(job.id).provisioning, 30, "the job to be provisioning")
        assert seen.provider == "sim"
        info = conn.job(job.id)
        assert info.state == "queued" and not info.unsatisfiable
        explained = conn.placement(job.id)
        assert explained.summary.startswith("provisioning: ")
        assert seen.instance_id in explained.summary
        job.wait(timeout=90)
        done = conn.job(job.id)
        assert done.state == "succeeded"
        assert done.worker_name == f"sim-{seen.instance_id}"
        # billed for its time on the instance: price x wall time (at least 1.5 s)
        assert done.cost is not None and done.cost >= 3.6 * 1.5 / 3600
        [inst] = instances(conn)
        assert inst.job_ids == [job.id] and inst.price_per_hour == 3.6
        gone = until(lambda: instances(conn, "gone"), 60, "the idle instance to be terminated")
        assert "idle for" in (gone[0].reason or "")
        assert gone[0].cost >= done.cost  # the instance's cost covers the job's share
        assert not [w for w in conn.workers() if w.name == done.worker_name]
    metrics = httpx.get(c.url + "gpulayer/metrics",
                        headers={"Authorization": f"Bearer {c.admin_token}"}).text  # fmt: skip
    assert 'gpulayer_instances{provider="sim",state="gone"} 1.0' in metrics
    assert 'gpulayer_instance_cost_dollars{provider="sim"}' in metrics


def test_an_instance_that_does_not_join_within_boot_timeout_is_terminated_and_the_job_provisioned_again(  # noqa: E501
    gl_provider_cluster,
):
    slow = {**A100, "boot_seconds": 120}
    c = gl_provider_cluster({"sim": {"kind": "simulated", "boot_timeout": 2, "offers": [slow]}})
    with c.connection() as conn:
        job = gl.submit([PY, "-c", "pass"], gpus=1, connection=conn)
        failed = until(lambda: instances(conn, "failed"), 60, "the slow instance to fail")
        assert "did not join within 2s (boot_timeout)" in (failed[0].reason or "")
        assert failed[0].job_ids == [job.id]
        again = until(
            lambda: [i for i in instances(conn) if i.state.active and job.id in i.job_ids],
            30, "a new instance for the job",
        )  # fmt: skip
        assert again[0].id != failed[0].id
        assert conn.job(job.id).provisioning.instance_id == again[0].id


def test_a_capacity_error_backs_off_that_offer_and_the_next_offer_is_used(gl_provider_cluster):
    cheap = {**A100, "name": "cheap", "price_per_hour": 1.0, "capacity_errors": -1}
    dear = {**A100, "name": "dear", "price_per_hour": 5.0}
    c = gl_provider_cluster({"sim": {"kind": "simulated", "offers": [cheap, dear]}})
    with c.connection() as conn:
        job = gl.submit([PY, "-c", "pass"], gpus=1, connection=conn)
        job.wait(timeout=90)
        assert conn.job(job.id).state == "succeeded"
        cheap_tries = [i for i in instances(conn) if i.offer == "cheap"]
        assert len(cheap_tries) == 1  # backed off: not asked again while the job waited
        by_offer = {i.offer: i for i in instances(conn)}
        assert by_offer["cheap"].state == "failed"
        assert "no capacity for cheap" in (by_offer["cheap"].reason or "")
        assert by_offer["dear"].job_ids == [job.id]
        [sim] = conn.providers()
        assert [o.name for o in sim.offers] == ["cheap", "dear"]


def test_min_instances_are_kept_and_max_instances_never_exceeded(gl_provider_cluster):
    one = {"kind": "simulated", "min_instances": 1, "max_instances": 1, "slots": 1,
           "idle_timeout": 1, "offers": [A100]}  # fmt: skip
    c = gl_provider_cluster({"sim": one})
    with c.connection() as conn:
        [first] = until(lambda: instances(conn, "idle"), 60, "the min_instances instance")
        assert first.job_ids == []  # started for min_instances, not for a job
        jobs = [gl.submit([PY, "-c", "import time; time.sleep(1)"], gpus=1, connection=conn)
                for _ in range(3)]  # fmt: skip
        for j in jobs:
            j.wait(timeout=90)
            assert conn.job(j.id).state == "succeeded"
            assert conn.job(j.id).worker_name == f"sim-{first.id}"
        assert [i.id for i in instances(conn)] == [first.id]  # never a second one
        until(lambda: instances(conn, "idle"), 30, "the instance idle again")
        assert [i.state for i in instances(conn)] == ["idle"]  # idle, but kept: min_instances


def test_a_worker_with_a_running_task_is_never_terminated(gl_provider_cluster, gl_shared_dir):
    c = gl_provider_cluster({"sim": {"kind": "simulated", "idle_timeout": 1, "offers": [A100]}})
    go = gl_shared_dir / "go"
    ticking = (
        f"import os, time\nwhile not os.path.exists({str(go)!r}):\n"
        "    print('tick', flush=True); time.sleep(0.2)"
    )
    with c.connection() as conn:
        job = gl.submit([PY, "-c", ticking], gpus=1, connection=conn)
        until(lambda: conn.job(job.id).state == "running", 60, "the job to run")
        [inst] = instances(conn)
        name = f"sim-{inst.id}"
        # Many idle_timeouts pass while the task runs: every look finds the instance
        # ready, its worker neither draining nor gone, and the task still printing.
        seen: set[str] = set()
        ticks = first = len(printed(conn, job.id))
        deadline = time.monotonic() + 6  # six idle_timeouts
        while time.monotonic() < deadline:
            seen |= {i.state.value for i in instances(conn)}
            [worker] = [w for w in conn.workers() if w.name == name]
            seen.add(f"worker {worker.state.value}")
            now = len(printed(conn, job.id))
            assert now >= ticks
            ticks = now
            time.sleep(0.2)
        assert seen == {"ready", "worker ready"}
        assert ticks > first  # the task kept running all along
        assert conn.job(job.id).state == "running"
        go.touch()
        job.wait(timeout=60)
        done = conn.job(job.id)
        assert done.state == "succeeded" and done.attempts == 1  # never lost, never retried
        assert done.worker_name == name
        # once the task ended: idle, then terminated
        [gone] = until(lambda: instances(conn, "gone"), 30, "the instance terminated once idle")
        assert "idle for" in (gone.reason or "")
        assert gone.ended_at > done.ended_at


def test_an_instance_that_vanishes_is_lost_and_its_task_retried_on_a_fresh_one(
    gl_provider_cluster, gl_shared_dir
):
    c = gl_provider_cluster({"sim": {"kind": "simulated", "offers": [A100]}})
    state = c.data_dir / "providers" / "sim" / "instances.json"
    go = gl_shared_dir / "go"
    wait_for_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    with c.connection() as conn:
        job = gl.submit([PY, "-c", wait_for_go], gpus=1, retries=2, connection=conn)
        until(lambda: conn.job(job.id).state == "running", 90, "the job to run")
        [first] = instances(conn)
        # The cloud reclaims the machine mid-task (a spot instance): its processes are
        # gone without a word. (Not `vanish_after`: a deadline that also hits the fresh
        # instance would race the retry on a loaded machine.)
        [entry] = json.loads(state.read_text()).values()
        for pid in entry["pids"]:
            os.killpg(pid, signal.SIGKILL)
        lost = until(lambda: instances(conn, "lost"), 60, "the instance to be lost")
        assert lost[0].id == first.id and lost[0].reason == "sim no longer has it"
        go.touch()  # the retry finishes at once
        job.wait(timeout=120)
        info = conn.job(job.id)
        assert info.state == "succeeded" and info.attempts == 2
        assert info.worker_name not in ("", None, f"sim-{first.id}")


def test_orphan_sweep_at_start_terminates_unknown_instances_and_marks_missing_ones_lost(
    gl_provider_cluster, tmp_path
):
    c = gl_provider_cluster({"sim": {"kind": "simulated", "offers": [A100]}})
    with c.connection() as conn:
        job = gl.submit([PY, "-c", "pass"], gpus=1, connection=conn)
        job.wait(timeout=90)
        [known] = instances(conn, "idle") or until(lambda: instances(conn, "idle"), 30)
    state = c.data_dir / "providers" / "sim" / "instances.json"
    c.stop()  # the control plane stops; its instances keep running, like cloud machines
    entries = json.loads(state.read_text())
    [entry] = entries.values()
    for pid in entry["pids"]:  # the provider loses the known instance ...
        os.killpg(pid, signal.SIGKILL)
    # ... and holds one the store never heard of
    orphan = subprocess.Popen([PY, "-c", "import time; time.sleep(600)", "--name", "sim-orphan"],
                              start_new_session=True)  # fmt: skip
    entries = {"sim-orphan": {"instance_id": "0rphan00", "external_id": "sim-orphan",
                              "pids": [orphan.pid], "workers": ["sim-orphan"],
                              "created_at": 0.0, "boot_at": 0.0, "vanish_at": None}}  # fmt: skip
    state.write_text(json.dumps(entries))
    c.start()
    with c.connection() as conn:
        until(lambda: orphan.poll() is not None, 30, "the orphan to be terminated")
        until(lambda: "sim-orphan" not in json.loads(state.read_text()), 30)
        lost = until(lambda: [i for i in instances(conn, "lost") if i.id == known.id], 30)
        assert lost[0].reason == "sim no longer has it"


def test_an_intent_left_open_by_a_crash_is_reconciled_at_restart(gl_provider_cluster):
    slow_api = {**A100, "create_seconds": 60}  # the instance exists long before the answer
    c = gl_provider_cluster({"sim": {"kind": "simulated", "offers": [slow_api]}})
    state = c.data_dir / "providers" / "sim" / "instances.json"
    with c.connection() as conn:
        job = gl.submit([PY, "-c", "print('ran')"], gpus=1, connection=conn)
        until(lambda: state.exists() and json.loads(state.read_text()), 30, "the instance")
        [asked] = instances(conn)
        assert asked.external_id is None  # intent written, outcome not yet
    c.restart_control_plane(signal.SIGKILL)  # crash between the intent and the outcome
    with c.connection() as conn:
        until(lambda: conn.job(job.id).state == "succeeded", 90, "the job to run")
        [adopted] = instances(conn)
        assert adopted.id == asked.id and adopted.external_id is not None
        assert conn.job(job.id).worker_name == f"sim-{asked.id}"
