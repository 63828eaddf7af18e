"""Limits on what clients and workers send, through a real Jupyter server with the
extension: refused with a 4xx naming the field, nothing stored, no 500."""

from .test_worker_handlers import join, registration

EVIL_PATTERN = "(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)X"


def job(**resources):
    return {"command": ["true"], "resources": {"gpus": 1, **resources}}


async def test_a_gpu_model_the_linear_engine_cannot_compile_is_400_naming_it(gl_api):
    for pattern in [r"(a)\1", "(?=A100)", "x{1001}", "(", "A" * 201]:
        status, err = await gl_api("jobs", method="POST", json_body=job(gpu_model=pattern))
        assert status == 400, (pattern, err)
        assert err["field"] == "resources.gpu_model", err
    status, batch = await gl_api(
        "jobs", "batch", method="POST", json_body={"jobs": [job(), job(gpu_model="(?<=x)")]}
    )
    assert status == 400 and batch["field"].endswith("resources.gpu_model"), batch
    status, page = await gl_api("jobs")
    assert page["jobs"] == []


async def test_a_catastrophic_pattern_is_matched_at_once(gl_api):
    """The backtracking pattern of issue 15 against a long GPU name: placement and
    every read of the job answer at once; the job waits with a reason."""
    name = "NVIDIA GeForce RTN 4090 Laptop GPU, one long name without the letter"
    dev = {"index": 0, "kind": "cuda", "name": name, "memory_bytes": 16 << 30}
    await join(gl_api, devices=[dev])
    status, queued = await gl_api("jobs", method="POST", json_body=job(gpu_model=EVIL_PATTERN))
    assert status == 201 and queued["state"] == "queued"
    assert "only 0 of its 1 GPU match" in queued["pending_reasons"][0], queued
    status, placement = await gl_api("jobs", queued["id"], "placement")
    assert status == 200 and not placement["workers"][0]["fits"], placement
    status, ok = await gl_api("jobs", method="POST", json_body=job(gpu_model="rtn.*4090"))
    assert status == 201 and ok["state"] == "scheduled", ok


async def test_selectors_are_capped(gl_api):
    selector = {f"k{i}": "v" for i in range(33)}
    status, err = await gl_api("jobs", method="POST", json_body=job(selector=selector))
    assert status == 400 and err["field"] == "resources.selector", err


# ---------------------------------------------------- shapes that used to be 500s


async def running_task(gl_api):
    """A registered worker running one job's task: (worker id, worker token, task id)."""
    reg = await join(gl_api)
    await gl_api("jobs", method="POST", json_body={"command": ["true"]})
    _, got = await gl_api("workers", reg["worker_id"], "acquire", method="POST", token=reg["token"])
    return reg["worker_id"], reg["token"], got["assignments"][0]["task_id"]


def snapshot(path):
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = ["jobs", "tasks", "events", "logs", "metrics", "workers", "tokens", "artifacts"]
        return {t: sorted(map(tuple, con.execute(f"SELECT * FROM {t}"))) for t in tables}
    finally:
        con.close()


async def test_deep_nesting_and_lone_surrogates_are_400(gl_api, gl_data_dir):
    await gl_api("health")
    before = snapshot(gl_data_dir / "gpulayer.db")
    deep = b'{"command": ["true"], "env": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    status, err = await gl_api("jobs", method="POST", body=deep)
    assert status == 400 and "nested too deeply" in err["message"], err
    surrogate = b'{"command": ["true"], "env": {"A": "\\ud800"}}'
    status, err = await gl_api("jobs", method="POST", body=surrogate)
    assert status == 400 and err["field"] == "env.A" and "Unicode" in err["message"], err
    key = b'{"command": ["true"], "env": {"\\udfff": "x"}}'
    status, err = await gl_api("jobs", method="POST", body=key)
    assert status == 400 and err["field"].startswith("env."), err
    huge = b'{"command": ["true"], "priority": 1' + b"0" * 5000 + b"}"
    status, err = await gl_api("jobs", method="POST", body=huge)
    assert status == 400, err
    assert snapshot(gl_data_dir / "gpulayer.db") == before


async def test_token_expiry_must_be_a_finite_time_and_odd_stored_rows_stay_readable(
    gl_api, gl_data_dir
):
    for expires in (b"Infinity", b"1e308", b"1e400", b'"99999999999999999d"', b"NaN"):
        body = b'{"name": "t", "role": "viewer", "expires": ' + expires + b"}"
        status, err = await gl_api("tokens", method="POST", body=body)
        assert status == 400 and err["field"] == "expires", (expires, err)
    status, made = await gl_api(
        "tokens", method="POST", json_body={"name": "odd", "role": "viewer", "expires": "1d"}
    )
    assert status == 201
    import sqlite3

    # A row written by an older version, before expiries were bounded.
    with sqlite3.connect(gl_data_dir / "gpulayer.db") as con:
        con.execute("UPDATE tokens SET expires_at = 1e308 WHERE name = 'odd'")
    status, listing = await gl_api("tokens")
    assert status == 200, listing
    [odd] = [t for t in listing["tokens"] if t["name"] == "odd"]
    assert odd["state"] == "active" and odd["expires_at"].startswith("9999-")
    status, _ = await gl_api("jobs", token=made["token"])
    assert status == 200


async def test_integers_beyond_64_bits_in_worker_routes_are_400_naming_the_field(
    gl_api, gl_data_dir
):
    wid, tok, tid = await running_task(gl_api)
    now = "2026-01-01T00:00:00Z"
    big = 2**63
    before = snapshot(gl_data_dir / "gpulayer.db")
    cases = [
        (("workers", wid, "heartbeat"), {"memory_used_bytes": big}, "memory_used_bytes"),
        (("workers", wid, "heartbeat"), {"memory_used_bytes": str(big)}, "memory_used_bytes"),
        (
            ("workers", wid, "heartbeat"),
            {"gpus": [{"index": 0, "memory_used_bytes": big}]},
            "gpus.0.memory_used_bytes",
        ),
        (
            ("tasks", tid, "metrics"),
            {"seq": 0, "points": [{"step": big, "ts": now, "metrics": {"loss": 1.0}}]},
            "points.0.step",
        ),
        (
            ("tasks", tid, "logs"),
            {"seq": 0, "lines": [{"stream": "stdout", "ts": now, "text": "x", "rank": big}]},
            "lines.0.rank",
        ),
        (("tasks", tid, "logs"), {"seq": big, "lines": []}, "seq"),
        (("tasks", tid, "complete"), {"state": "failed", "exit_code": big}, "exit_code"),
        (("tasks", tid, "complete"), {"state": "failed", "exit_code": -big - 1}, "exit_code"),
    ]
    for parts, body, field in cases:
        status, err = await gl_api(*parts, method="POST", json_body=body, token=tok)
        assert status == 400 and err["field"] == field, (parts, body, err)
    after = snapshot(gl_data_dir / "gpulayer.db")
    # heartbeats refused: nothing stored, not even the heartbeat time
    assert after == before
    status, done = await gl_api(
        "tasks", tid, "complete", method="POST", json_body={"state": "failed", "exit_code": 3},
        token=tok,
    )  # fmt: skip
    assert status == 200 and done["exit_code"] == 3


# ------------------------------------------------------- what workers may report


async def test_worker_reports_are_capped_with_a_400_naming_the_list(gl_api):
    gpu = {"index": 0, "kind": "cuda", "name": "A100", "memory_bytes": 1}
    many = [{**gpu, "index": i} for i in range(65)]
    status, err = await gl_api(
        "workers", "register", method="POST", json_body=registration(devices=many), token="join"
    )
    assert status == 400 and err["field"] == "devices" and "max_heartbeat_devices" in err["message"]
    status, err = await gl_api(
        "workers", "register", method="POST", token="join",
        json_body=registration(devices=[{**gpu, "name": "A" * 300}]),
    )  # fmt: skip
    assert status == 400 and err["field"] == "devices.0.name", err
    status, err = await gl_api(
        "workers", "register", method="POST", token="join",
        json_body=registration(labels={f"k{i}": "v" for i in range(65)}),
    )  # fmt: skip
    assert status == 400 and err["field"] == "labels", err
    assert (await gl_api("workers"))[1]["workers"] == []

    reg = await join(gl_api)
    beat = ("workers", reg["worker_id"], "heartbeat")
    cases = [
        ({"gpus": [{"index": i} for i in range(65)]}, "gpus"),
        ({"tasks": [{"task_id": f"t{i}"} for i in range(257)]}, "tasks"),
        ({"running_tasks": [f"t{i}" for i in range(257)]}, "running_tasks"),
        ({"tasks": [{"task_id": "t" * 65}]}, "tasks.0.task_id"),
    ]
    for body, field in cases:
        status, err = await gl_api(*beat, method="POST", json_body=body, token=reg["token"])
        assert status == 400 and err["field"] == field, (field, err)
    status, _ = await gl_api(*beat, method="POST", json_body={"gpus": [{"index": 0}]},
                             token=reg["token"])  # fmt: skip
    assert status == 200
    _, workers = await gl_api("workers")
    assert workers["workers"][0]["gpus"] == [{"index": 0, "utilization_percent": None,
        "memory_used_bytes": None, "temperature_c": None, "power_w": None}]  # fmt: skip


def test_the_telemetry_window_is_bounded_in_bytes_as_well_as_samples():
    from gpulayer.contracts import Heartbeat
    from jupyter_ext.fleet import Fleet

    fleet = Fleet(None, telemetry_samples=360, telemetry_bytes=50_000)
    busy = Heartbeat(tasks=[{"task_id": f"task-{i:04d}", "rss_bytes": i} for i in range(256)])
    for i in range(50):
        fleet.record("w", float(i), busy)
    assert 0 < fleet.window_bytes("w") <= 50_000
    kept = len(fleet.samples("w"))
    assert 1 <= kept < 50
    small = Fleet(None, telemetry_samples=3, telemetry_bytes=10**9)
    for i in range(10):
        small.record("w", float(i), Heartbeat(cpu_percent=float(i)))
    assert [s.cpu_percent for s in small.samples("w")] == [7.0, 8.0, 9.0]
    assert small.window_bytes("w") == sum(len(s.model_dump_json()) for s in small.samples("w"))


# ------------------------------------------------------------------ uploads


async def test_an_upload_whose_content_is_not_the_announced_sha256_is_400(gl_api, gl_data_dir):
    import hashlib

    data = b"bundle bytes" * 1000
    good = hashlib.sha256(data).hexdigest()
    status, ref = await gl_api("blobs", method="POST", body=data,
                               headers={"X-Gpulayer-Sha256": good})  # fmt: skip
    assert status == 201 and ref["sha256"] == good
    status, err = await gl_api("blobs", method="POST", body=data + b"!",
                               headers={"X-Gpulayer-Sha256": good})  # fmt: skip
    assert status == 400 and err["field"] == "sha256" and good in err["message"], err
    status, err = await gl_api("blobs", method="POST", body=data,
                               headers={"X-Gpulayer-Sha256": "nope"})  # fmt: skip
    assert status == 400 and err["field"] == "sha256", err
    blobs = gl_data_dir / "blobs"
    assert list((blobs / "tmp").iterdir()) == []  # refused uploads leave no file
    assert [p.name for p in blobs.glob("??/*")] == [good]


async def test_uploads_are_refused_by_role_and_size_before_they_are_stored(gl_api, gl_data_dir):
    status, viewer = await gl_api(
        "tokens", method="POST", json_body={"name": "v", "role": "viewer"}
    )
    status, err = await gl_api("blobs", method="POST", body=b"x" * 1000, token=viewer["token"])
    assert status == 403, err
    status, err = await gl_api("blobs", method="POST", body=b"x" * (1024 * 1024 + 1))
    assert status == 413 and "at most 1048576" in err["message"], err
    status, err = await gl_api("blobs", method="POST", body=b"x" * 1000, token="gl_" + "q" * 43)
    assert status == 401, err
    blobs = gl_data_dir / "blobs"
    assert list((blobs / "tmp").iterdir()) == [] and not list(blobs.glob("??/*"))
