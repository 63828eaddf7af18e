"""The autoscaler's lifecycle rules against the ``simulated`` provider: a real control
plane (as ``gpulayer up --providers FILE`` starts it) whose instances are real
``gpulayer join`` processes with simulated GPUs."""

import sys

import gpulayer.client as gl

from ..support import until

PY = sys.executable
A100 = {"name": "a100", "gpus": "1xA100-80GB", "price_per_hour": 3.6, "cpus": 4}


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
