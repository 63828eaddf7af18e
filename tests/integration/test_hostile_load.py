"""Hostile load against a real control plane and real workers (issue 15): patterns
that would stall a backtracking engine, bodies nobody authenticated, a flood of bad
tokens, oversized heartbeats and quotas. Each test checks what a user notices: the
server keeps answering, valid credentials keep working, memory stays flat."""

import httpx

from gpulayer import contracts

from ..support import until

#: Backtracks for minutes on a long name without an "x" in Python's `re` (issue 15).
EVIL_PATTERN = "(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)X"
#: The simulated GPU is "NVIDIA RTN-4090-Laptop-Edition-One-Long-Name (simulated)".
LONG_GPU = "1xRTN-4090-Laptop-Edition-One-Long-Name-16GB"
PROMPT_SECONDS = 10.0  # loose: a stalled server takes minutes, a busy CI box a second


def api(cluster) -> str:
    return cluster.url + contracts.API_PREFIX.lstrip("/") + "/"


def test_a_catastrophic_gpu_model_stalls_neither_health_nor_a_restart(fresh_cluster):
    c = fresh_cluster(workers=1, simulated_gpus=LONG_GPU)
    with c.connection() as conn:
        spec = contracts.JobSpec(command=["true"], resources={"gpus": 1, "gpu_model": EVIL_PATTERN})
        job = conn.submit(spec)
        fits = conn.submit(contracts.JobSpec(command=["true"], resources={"gpus": 1}))
        with httpx.Client(timeout=PROMPT_SECONDS) as http:
            for _ in range(3):
                assert http.get(api(c) + "health").status_code == 200
        assert until(lambda: conn.job(fits.id).state == "succeeded", what="the other job")
        assert conn.job(job.id).state == "queued"
    c.restart_control_plane()  # waits for health; a stalled start-up placement pass fails it
    with c.connection() as conn, httpx.Client(timeout=PROMPT_SECONDS) as http:
        assert http.get(api(c) + "health").status_code == 200
        waiting = conn.job(job.id)
        assert waiting.state == "queued" and "GPU match" in waiting.pending_reasons[0]
