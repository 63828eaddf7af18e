"""``GET /gpulayer/metrics`` parsed with prometheus-client's own parser, against the store.

The test plays a worker by hand (register, heartbeat with GPU readings, acquire,
ship logs), so every value the scrape shows can be compared with what the REST
API says about the same control plane.
"""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "gpulayer.json"
GPUS = [
    {"index": i, "kind": "cuda", "name": "NVIDIA A100 (simulated)", "memory_bytes": 80 << 30}
    for i in range(2)
]


def _registration(name: str) -> dict:
    return {"name": name, "hostname": "h-" + name, "cpus": 4, "memory_bytes": 8 << 30,
            "version": "test", "slots": 2, "devices": GPUS}  # fmt: skip


def _lines(*texts: str) -> list[dict]:
    now = datetime.now(UTC).isoformat()
    return [{"stream": "stdout", "ts": now, "text": t} for t in texts]


async def scrape(gl_api, token="admin") -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}."""
    status, body = await gl_api("metrics", prefix=("gpulayer",), token=token)
    assert status == 200, body
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


async def test_scrape_matches_the_store(gl_api):
    status, reg = await gl_api(
        "workers", "register", method="POST", json_body=_registration("m1"), token="join"
    )
    assert status == 200
    wid, wtok = reg["worker_id"], reg["token"]
    readings = [
        {"index": 0, "utilization_percent": 87.5, "memory_used_bytes": 30 << 30},
        {"index": 1, "utilization_percent": 0.0, "memory_used_bytes": 0},
    ]
    status, _ = await gl_api(
        "workers", wid, "heartbeat", method="POST", json_body={"gpus": readings}, token=wtok
    )
    assert status == 200
    spec = {"command": ["true"], "resources": {"gpus": 1}}
    _, placed = await gl_api("jobs", method="POST", json_body=spec)
    _, waiting = await gl_api("jobs", method="POST", json_body={**spec, "resources": {"gpus": 8}})
    _, gone = await gl_api("jobs", method="POST", json_body={**spec, "resources": {"gpus": 8}})
    await gl_api("jobs", gone["id"], "cancel", method="POST")
    status, got = await gl_api(
        "workers", wid, "acquire", method="POST", params={"wait": "0"}, token=wtok
    )
    (task,) = got["assignments"]
    batch = {"seq": 0, "lines": _lines("one", "two", "three")}
    for _ in range(2):  # the second send is a duplicate: stored once, counted once
        await gl_api("tasks", task["task_id"], "logs", method="POST", json_body=batch, token=wtok)

    m = await scrape(gl_api)

    _, jobs = await gl_api("jobs")
    by_state: dict[str, int] = {}
    for j in jobs["jobs"]:
        by_state[j["state"]] = by_state.get(j["state"], 0) + 1
    assert by_state == {"running": 1, "queued": 1, "cancelled": 1}
    for state in ("queued", "scheduled", "running", "succeeded", "cancelled", "failed"):
        assert m[("gpulayer_jobs", (("state", state),))] == by_state.get(state, 0)
    assert m[("gpulayer_queue_depth", ())] == 1
    assert m[("gpulayer_workers", (("state", "ready"),))] == 1
    assert m[("gpulayer_workers", (("state", "offline"),))] == 0

    gpu0 = (("gpu", "0"), ("model", "NVIDIA A100 (simulated)"), ("worker", "m1"))
    gpu1 = (("gpu", "1"), *gpu0[1:])
    assert m[("gpulayer_gpu_utilization_percent", gpu0)] == 87.5
    assert m[("gpulayer_gpu_memory_used_bytes", gpu0)] == 30 << 30
    assert m[("gpulayer_gpu_memory_total_bytes", gpu1)] == 80 << 30
    _, job = await gl_api("jobs", placed["id"])
    held = job["tasks"][-1]["gpu_indices"]
    assert held == [0]
    assert m[("gpulayer_gpu_reserved", gpu0)] == 1
    assert m[("gpulayer_gpu_reserved", gpu1)] == 0
    assert (m[("gpulayer_gpus", ())], m[("gpulayer_gpus_reserved", ())]) == (2, 1)

    _, page = await gl_api("jobs", placed["id"], "logs")
    assert len(page["lines"]) == 3
    assert m[("gpulayer_log_lines_ingested_total", ())] == 3
    # one placement and one pick-up so far; the queued job has not been placed
    assert m[("gpulayer_placement_latency_seconds_count", ())] == 1
    assert m[("gpulayer_dispatch_latency_seconds_count", ())] == 1
    assert m[("gpulayer_dispatch_latency_seconds_bucket", (("le", "+Inf"),))] == 1
    assert waiting["state"] == "queued"


async def test_scrape_is_prometheus_text_and_not_in_the_global_registry(gl_api, jp_fetch):
    # a scraper sends the bearer token of a viewer
    _, tok = await gl_api("tokens", method="POST", json_body={"name": "prom", "role": "viewer"})
    resp = await jp_fetch(
        "gpulayer", "metrics", headers={"Authorization": "Bearer " + tok["token"]}
    )
    assert resp.code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    assert b"# TYPE gpulayer_placement_latency_seconds histogram" in resp.body
    # several control planes in one process each keep their own series
    assert not any(m.name.startswith("gpulayer_") for m in prometheus_client.REGISTRY.collect())


async def test_gauges_follow_state_changes(gl_api):
    before = await scrape(gl_api)
    assert before[("gpulayer_queue_depth", ())] == 0
    assert before[("gpulayer_gpus", ())] == 0
    await gl_api("jobs", method="POST", json_body={"command": ["true"]})
    after = await scrape(gl_api)
    assert after[("gpulayer_queue_depth", ())] == 1
    assert after[("gpulayer_jobs", (("state", "queued"),))] == 1


async def test_the_grafana_dashboard_uses_only_exported_series(gl_api):
    _, reg = await gl_api(
        "workers", "register", method="POST", json_body=_registration("g1"), token="join"
    )
    reading = {"index": 0, "utilization_percent": 5.0, "memory_used_bytes": 1}
    await gl_api("workers", reg["worker_id"], "heartbeat", method="POST",
                 json_body={"gpus": [reading]}, token=reg["token"])  # fmt: skip
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"gpulayer_\w+", e)}
    _, body = await gl_api("metrics", prefix=("gpulayer",))
    exported = {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert used, "the dashboard queries no gpulayer series"
    assert used <= exported, f"the dashboard uses series nobody exports: {used - exported}"
