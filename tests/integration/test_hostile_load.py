"""Hostile load against a real control plane and real workers (issue 15): patterns
that would stall a backtracking engine, bodies nobody authenticated, a flood of bad
tokens, oversized heartbeats and quotas. Each test checks what a user notices: the
server keeps answering, valid credentials keep working, memory stays flat."""

import hashlib
import json
import socket
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer import contracts
from gpulayer.cluster import LocalCluster

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


# ------------------------------------------- fuzz: worker routes and poisoned shapes

NOW = "2026-01-01T00:00:00Z"
BIG = [2**63, 2**64, -(2**63) - 1, 10**30]
#: (method, route, token kind, a valid body, {dotted field: kind of poison it takes});
#: {wid}/{tid} are the hand-registered worker and its running task.
WORKER_ROUTES = [
    ("POST", "workers/register", "join",
     {"name": "fz", "hostname": "h", "cpus": 2, "memory_bytes": 1024, "version": "t",
      "devices": [{"index": 0, "kind": "cuda", "name": "A100", "memory_bytes": 1}]},
     {"cpus": "int", "memory_bytes": "int", "devices.0.memory_bytes": "int",
      "devices.0.index": "int", "name": "str", "hostname": "str", "devices.0.name": "str",
      "slots": "int"}),
    ("POST", "workers/{wid}/heartbeat", "worker",
     {"running_tasks": ["{tid}"], "memory_used_bytes": 1,
      "gpus": [{"index": 0, "memory_used_bytes": 1}],
      "tasks": [{"task_id": "{tid}", "rss_bytes": 1, "processes": 1}]},
     {"memory_used_bytes": "int", "gpus.0.memory_used_bytes": "int", "gpus.0.index": "int",
      "tasks.0.rss_bytes": "int", "tasks.0.processes": "int", "tasks.0.task_id": "str",
      "running_tasks.0": "str"}),
    ("POST", "tasks/{tid}/logs", "worker",
     {"seq": 0, "lines": [{"stream": "stdout", "ts": NOW, "text": "x", "rank": 0}]},
     {"seq": "int", "lines.0.rank": "int", "lines.0.text": "str"}),
    ("POST", "tasks/{tid}/metrics", "worker",
     {"seq": 0, "points": [{"step": 1, "epoch": 0, "rank": 0, "ts": NOW, "metrics": {"l": 1}}]},
     {"seq": "int", "points.0.step": "int", "points.0.epoch": "int", "points.0.rank": "int"}),
    ("POST", "tasks/{tid}/complete", "worker", {"state": "failed", "exit_code": 1, "reason": "r"},
     {"exit_code": "int", "reason": "str"}),
    ("POST", "jobs", "admin", {"command": ["true"], "env": {"A": "b"}, "timeout": 5},
     {"env.A": "str", "command.0": "str", "timeout": "duration", "priority": "int"}),
    ("POST", "tokens", "admin", {"name": "fz", "role": "viewer", "expires": 60},
     {"expires": "duration", "name": "str"}),
]  # fmt: skip
SURROGATE = "\ud800"


def _poisoned(body: dict, path: str, poison: object) -> dict:
    out = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = poison
    else:
        node[last] = poison
    return out


poisons = {
    "int": st.sampled_from(BIG) | st.sampled_from(BIG).map(str),
    "str": st.text(max_size=6).map(lambda s: s + SURROGATE),
    "duration": st.sampled_from([float("inf"), float("nan"), 1e308, "1e308", "9" * 30 + "d"]),
}
worker_requests = st.sampled_from(WORKER_ROUTES).flatmap(
    lambda r: st.tuples(
        st.just(r),
        st.sampled_from(sorted(r[4])).flatmap(lambda f: st.tuples(st.just(f), poisons[r[4][f]])),
        st.sampled_from(["flat", "deep", "deep-key"]),
    )
)


def test_worker_routes_refuse_poisoned_bodies_without_a_500_or_a_change(tmp_path):
    args = ["--GpulayerApp.login_failures_allowed=0", "--GpulayerApp.long_poll_seconds=0.05"]
    with LocalCluster(tmp_path / "fz", workers=0, server_args=args) as c:
        _fuzz_worker_routes(c)


def _fuzz_worker_routes(c) -> None:
    base = api(c)
    with httpx.Client(timeout=30) as http:
        admin = {"Authorization": f"Bearer {c.admin_token}"}
        join = {"Authorization": f"Bearer {c.join_token}"}
        reg = http.post(base + "workers/register", headers=join,
                        json=WORKER_ROUTES[0][3] | {"name": "box"}).json()  # fmt: skip
        http.post(base + "jobs", headers=admin, json={"command": ["true"]})
        wtok = {"Authorization": f"Bearer {reg['token']}"}
        got = http.post(base + f"workers/{reg['worker_id']}/acquire", headers=wtok).json()
        tid = got["assignments"][0]["task_id"]
        tokens = {"join": join, "worker": wtok, "admin": admin}
        db = c.data_dir / "gpulayer.db"
        before = _snapshot(db)
        seen: dict[int, int] = {}

        @settings(max_examples=400, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(req=worker_requests)
        def fuzz(req):
            (method, route, who, body, _), (field, poison), shape = req
            route = route.replace("{wid}", reg["worker_id"]).replace("{tid}", tid)
            text = json.dumps(_poisoned(body, field, poison)).replace("{tid}", tid)
            if shape == "deep":  # the poison, plus a field nested past the recursion limit
                text = text[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}"
            elif shape == "deep-key":
                text = text[:-1] + ', "x": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + "}"
            resp = http.request(method, base + route, headers=tokens[who], content=text)
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            assert 400 <= resp.status_code < 500, (route, field, shape, resp.text[:300])
            assert "Traceback" not in resp.text

        fuzz()
        assert _snapshot(db) == before
        assert set(seen) <= {400, 413}, seen
        # the worker and its task still work after all that
        ok = http.post(base + f"tasks/{tid}/complete", headers=wtok,
                       json={"state": "succeeded", "exit_code": 0})  # fmt: skip
        assert ok.status_code == 200, ok.text


def _snapshot(db) -> dict[str, list[tuple]]:
    tables = ["jobs", "tasks", "events", "logs", "metrics", "artifacts", "workers", "tokens"]
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: sorted(map(tuple, con.execute(f"SELECT * FROM {t}"))) for t in tables}
    finally:
        con.close()


# ------------------------------------------------------------ failed-login limiting


def test_a_flood_of_bad_tokens_locks_out_neither_the_admin_nor_a_running_job(fresh_cluster):
    c = fresh_cluster(workers=1)  # the default limit: 10 failures a minute per address
    with c.connection() as conn:
        job = conn.submit(contracts.JobSpec(command=["sleep", "6"]))
        until(lambda: conn.job(job.id).state == "running", what="the job to start")
        statuses = []
        with httpx.Client(timeout=PROMPT_SECONDS) as http:
            for i in range(50):
                bad = {"Authorization": f"Bearer gl_{i:043d}"}
                statuses.append(http.get(api(c) + "jobs", headers=bad).status_code)
        assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}, statuses
        assert [j.id for j in conn.jobs()] == [job.id]  # the admin token still works
        done = until(lambda: (j := conn.job(job.id)).state.terminal and j, timeout=60)
        assert done.state == "succeeded", done.reason  # the worker's heartbeats got through
        assert conn.workers()[0].state == "ready"


# ---------------------------------------------- bodies: refused unread, or streamed

MIB = 1024 * 1024


def rss_mib(c) -> float:
    return psutil.Process(c.server_pid).memory_info().rss / MIB


def declare_huge(c, path: str, length: int, token: str | None = None) -> tuple[int, int]:
    """POST ``length`` declared bytes over a raw socket and keep sending until the server
    stops taking them; returns (the answer's status, bytes the server let us send)."""
    url = httpx.URL(c.url)
    head = (f"POST {url.path}{contracts.API_PREFIX.lstrip('/')}/{path} HTTP/1.1\r\n"
            f"Host: {url.host}:{url.port}\r\nContent-Length: {length}\r\n"
            "Content-Type: application/octet-stream\r\n"
            + (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n")  # fmt: skip
    chunk, sent = b"\0" * MIB, 0
    with socket.create_connection((url.host, url.port), timeout=PROMPT_SECONDS) as sock:
        sock.sendall(head.encode())
        status = int(sock.recv(4096).split(b" ", 2)[1])  # answered before the body
        try:
            while sent < length:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the server closed the connection: it reads no more
            pass
    return status, sent


def test_bodies_are_refused_before_they_are_read_or_streamed_to_disk(fresh_cluster):
    c = fresh_cluster(workers=0)
    with c.connection() as conn:
        conn.jobs()  # warm: every module the routes need is loaded
    before = rss_mib(c)
    declared = 400 * MIB
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda p: declare_huge(c, p, declared), ["blobs", "jobs"]))
    for status, sent in answers:
        assert status == 401 and sent < declared // 2, answers
    # an authenticated body over a route's limit is refused unread too
    status, sent = declare_huge(c, "jobs", declared, c.admin_token)
    assert status == 413 and sent < declared // 2
    assert rss_mib(c) - before < 100

    # an authenticated 200 MiB bundle is streamed to the blob store, hashed on the way
    size, digest = 200 * MIB, hashlib.sha256()
    block = bytes(range(256)) * 4096  # 1 MiB
    for _ in range(size // MIB):
        digest.update(block)
    headers = {"Authorization": f"Bearer {c.admin_token}"}
    with httpx.Client(timeout=120) as http:
        resp = http.post(api(c) + "blobs", headers=headers,
                         content=(block for _ in range(size // MIB)))  # fmt: skip
    assert resp.status_code == 201, resp.text
    assert resp.json() == {"sha256": digest.hexdigest(), "size": size}
    assert (
        c.data_dir / "blobs" / digest.hexdigest()[:2] / digest.hexdigest()
    ).stat().st_size == size
    assert rss_mib(c) - before < 100
    with httpx.Client(timeout=PROMPT_SECONDS) as http:
        assert http.get(api(c) + "health").status_code == 200


def test_a_200k_entry_heartbeat_is_400_and_leaves_memory_and_listings_small(fresh_cluster):
    c = fresh_cluster(workers=0)
    base = api(c)
    with httpx.Client(timeout=60) as http:
        join = {"Authorization": f"Bearer {c.join_token}"}
        body = {"name": "big", "hostname": "h", "cpus": 2, "memory_bytes": 1, "version": "t"}
        reg = http.post(base + "workers/register", headers=join, json=body).json()
        worker = {"Authorization": f"Bearer {reg['token']}"}
        beat = base + f"workers/{reg['worker_id']}/heartbeat"
        assert http.post(beat, headers=worker, json={"gpus": [{"index": 0}]}).status_code == 200
        before = rss_mib(c)
        for _ in range(3):
            huge = {"gpus": [{"index": i % 8, "memory_used_bytes": i} for i in range(200_000)]}
            resp = http.post(beat, headers=worker, json=huge)
            assert resp.status_code == 400 and resp.json()["field"] == "gpus", resp.text[:300]
        assert rss_mib(c) - before < 100  # the parse is transient; nothing is kept
        listing = http.get(base + "workers", headers={"Authorization": f"Bearer {c.admin_token}"})
        assert len(listing.content) < 16 * 1024
        assert listing.json()["workers"][0]["gpus"] == [
            {"index": 0, "utilization_percent": None, "memory_used_bytes": None,
             "temperature_c": None, "power_w": None}]  # fmt: skip
