"""The ``local`` provider: workers as processes on this machine, started when a job
needs one and stopped when idle (what ``gpulayer up --local-workers N`` starts by
hand, on demand)."""

import json
import os
import sys
from pathlib import Path

import gpulayer.client as gl

from ..support import until

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_local_instance_is_a_worker_process_here_started_for_jobs_and_stopped_when_idle(
    gl_provider_cluster,
):
    here = {"kind": "local", "gpus": "2xA100-80GB", "idle_timeout": 2}
    c = gl_provider_cluster({"here": here})
    state = c.data_dir / "providers" / "here" / "instances.json"
    with c.connection() as conn:
        [provider] = conn.providers()
        [offer] = provider.offers
        assert (provider.kind, offer.name, offer.price_per_hour) == ("local", "this-machine", 0.0)
        assert offer.gpus == 2 and offer.cpus == os.cpu_count()
        # two one-GPU jobs at once: one instance (max_instances 1) runs both
        jobs = [gl.submit([PY, "-c", "print('ran here')"], gpus=1, connection=conn)
                for _ in range(2)]  # fmt: skip
        for j in jobs:
            j.wait(timeout=90)
        [inst] = conn.instances()
        name = f"here-{inst.id}"
        assert {conn.job(j.id).worker_name for j in jobs} == {name}
        assert {conn.job(j.id).state for j in jobs} == {"succeeded"}
        [worker] = [w for w in conn.workers() if w.name == name]
        assert [d.name for d in worker.devices] == ["NVIDIA A100 (simulated)"] * 2
        assert worker.labels["provider"] == "here" and inst.cost == 0.0
        # the instance is a `gpulayer join` process on this machine, recorded by PID
        [entry] = json.loads(state.read_text()).values()
        [pid] = entry["pids"]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"join" in cmdline and name.encode() in cmdline
        # idle for idle_timeout: the process is stopped and the instance gone
        [gone] = until(lambda: [i for i in conn.instances() if i.state == "gone"], 60, "idle")
        assert "idle for" in (gone.reason or "")
        until(lambda: not alive(pid), 30, "the worker process to end")
        assert json.loads(state.read_text()) == {}
        # the record goes once the provider forgets the stopped worker, just after
        until(lambda: not [w for w in conn.workers() if w.name == name], 30, "the worker forgotten")
