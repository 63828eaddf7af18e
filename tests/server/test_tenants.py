"""Tenants against a real control plane: what one submitter may see and use of another's.

Two submitter tokens (``ada`` and ``bob``), plus the admin and a viewer, talk to the
real server over HTTP; the worker's side is played by hand (register, acquire,
heartbeat) so every reading is known.
"""

import json

import pytest

GPU = {"index": 0, "kind": "cuda", "name": "NVIDIA A100", "memory_bytes": 80 << 30}


async def token(gl_api, name: str, role: str = "submitter") -> str:
    status, made = await gl_api("tokens", method="POST", json_body={"name": name, "role": role})
    assert status == 201, made
    return made["token"]


async def tenants(gl_api) -> dict[str, str]:
    """Tokens by name: ``ada`` and ``bob`` (submitters), ``vera`` (viewer), ``admin``."""
    return {
        "ada": await token(gl_api, "ada"),
        "bob": await token(gl_api, "bob"),
        "vera": await token(gl_api, "vera", "viewer"),
        "admin": "admin",
    }


async def join(gl_api, name: str = "box", **kw) -> dict:
    body = {"name": name, "hostname": "h-" + name, "cpus": 4, "memory_bytes": 8 << 30,
            "version": "test", "slots": 4, **kw}  # fmt: skip
    status, reg = await gl_api("workers", "register", method="POST", json_body=body, token="join")
    assert status == 200, reg
    return reg


async def submit(gl_api, tok: str, **spec) -> dict:
    body = {"command": ["true"], **spec}
    status, job = await gl_api("jobs", method="POST", json_body=body, token=tok)
    assert status == 201, job
    return job


async def acquire(gl_api, reg: dict) -> dict[str, str]:
    """Start the worker's scheduled tasks: job id -> task id."""
    status, got = await gl_api("workers", reg["worker_id"], "acquire", method="POST",
                               params={"wait": "0"}, token=reg["token"])  # fmt: skip
    assert status == 200, got
    return {a["job_id"]: a["task_id"] for a in got["assignments"]}


async def test_submitters_see_only_their_own_tasks_on_workers_and_in_telemetry(gl_api):
    gl_tenants = await tenants(gl_api)
    reg = await join(gl_api)
    mine = await submit(gl_api, gl_tenants["ada"])
    theirs = await submit(gl_api, gl_tenants["bob"])
    tasks = await acquire(gl_api, reg)
    t_ada, t_bob = tasks[mine["id"]], tasks[theirs["id"]]
    samples = [
        {"task_id": t_ada, "cpu_percent": 12.5, "rss_bytes": 1 << 20, "processes": 1},
        {"task_id": t_bob, "cpu_percent": 99.0, "rss_bytes": 7 << 30, "processes": 9},
    ]
    hb = {"running_tasks": [t_ada, t_bob], "cpu_percent": 50.0, "tasks": samples}
    status, _ = await gl_api("workers", reg["worker_id"], "heartbeat", method="POST",
                             json_body=hb, token=reg["token"])  # fmt: skip
    assert status == 200

    async def seen(who: str) -> tuple[set[str], set[str], set[str]]:
        _, listing = await gl_api("workers", token=gl_tenants[who])
        (w,) = listing["workers"]
        status, tel = await gl_api("workers", "box", "telemetry", token=gl_tenants[who])
        assert status == 200 and tel["samples"], tel
        return (
            set(w["running_tasks"]),
            {s["task_id"] for s in w["tasks"]},
            {t["task_id"] for s in tel["samples"] for t in s["tasks"]},
        )

    assert await seen("ada") == ({t_ada},) * 3
    assert await seen("bob") == ({t_bob},) * 3
    assert await seen("admin") == ({t_ada, t_bob},) * 3
    assert await seen("vera") == ({t_ada, t_bob},) * 3  # a viewer watches the whole fleet
    # what is not per task stays visible to every reader
    _, listing = await gl_api("workers", token=gl_tenants["bob"])
    assert listing["workers"][0]["cpu_percent"] == 50.0
    assert listing["workers"][0]["name"] == "box"


async def test_pending_reasons_name_no_other_owners_jobs(gl_api):
    gl_tenants = await tenants(gl_api)
    await join(gl_api, devices=[GPU])
    running = await submit(gl_api, gl_tenants["ada"], resources={"gpus": 1})
    assert running["state"] == "scheduled"
    waiting = await submit(gl_api, gl_tenants["bob"], resources={"gpus": 1})
    again = await submit(gl_api, gl_tenants["ada"], resources={"gpus": 1})

    async def reasons(who: str, job: dict) -> tuple[list[str], str]:
        status, got = await gl_api("jobs", job["id"], token=gl_tenants[who])
        assert status == 200 and got["state"] == "queued", got
        status, placement = await gl_api("jobs", job["id"], "placement", token=gl_tenants[who])
        assert status == 200
        return got["pending_reasons"], json.dumps(placement)

    held = f"job {running['id'][:6]}"
    pending, explained = await reasons("bob", waiting)
    assert pending == ["box: needs 1 × GPU, has 0 free (GPU 0 busy)"]
    assert running["id"][:6] not in explained and "GPU 0 busy" in explained
    pending, explained = await reasons("ada", again)  # its own job is named
    assert pending == [f"box: needs 1 × GPU, has 0 free (GPU 0 busy with {held})",
                       "behind 1 queued job (higher priority or older)"]  # fmt: skip
    assert waiting["id"][:6] not in explained and "behind 1 queued job" in explained
    for who in ("admin", "vera"):  # operators see every holder
        pending, _ = await reasons(who, waiting)
        assert pending == [f"box: needs 1 × GPU, has 0 free (GPU 0 busy with {held})"]


async def test_a_blob_is_usable_only_by_its_uploader_and_its_existence_does_not_leak(gl_api):
    gl_tenants = await tenants(gl_api)
    ada, bob = gl_tenants["ada"], gl_tenants["bob"]
    status, ref = await gl_api("blobs", method="POST", body=b"ada's code", token=ada)
    assert status == 201
    sha, never = ref["sha256"], "0" * 64
    fn = {"format": 1, "python": "3.11"}
    specs = {
        "bundle": lambda s: {"command": ["true"], "bundle": s},
        "function.payload_blob": lambda s: {"kind": "function",
                                            "function": {**fn, "payload_blob": s}},
        "cell.push_blob": lambda s: {"kind": "cell", "cell": {"source": "1", "push_blob": s}},
    }  # fmt: skip
    for field, spec in specs.items():
        stolen = await gl_api("jobs", method="POST", json_body=spec(sha), token=bob)
        missing = await gl_api("jobs", method="POST", json_body=spec(never), token=bob)
        # refused exactly like a blob that does not exist: no oracle
        assert stolen[0] == missing[0] == 400, (stolen, missing)
        assert stolen[1]["field"] == missing[1]["field"] == field
        assert stolen[1]["message"].replace(sha, never) == missing[1]["message"]
        assert (await gl_api("jobs", method="POST", json_body=spec(sha), token=ada))[0] == 201
        assert (await gl_api("jobs", method="POST", json_body=spec(sha)))[0] == 201  # admin
    _, page = await gl_api("jobs", token=bob)
    assert page["jobs"] == []
    # uploading the same bytes makes them bob's too
    status, again = await gl_api("blobs", method="POST", body=b"ada's code", token=bob)
    assert status == 201 and again["sha256"] == sha
    assert (await gl_api("jobs", method="POST", json_body=specs["bundle"](sha), token=bob))[
        0
    ] == 201


async def test_artifacts_after_the_task_completed_are_409(gl_api):
    gl_tenants = await tenants(gl_api)
    reg = await join(gl_api)
    job = await submit(gl_api, gl_tenants["ada"])
    task = (await acquire(gl_api, reg))[job["id"]]
    put = ("tasks", task, "artifacts", "early.txt")
    assert (await gl_api(*put, method="PUT", body=b"in time", token=reg["token"]))[0] == 201
    status, _ = await gl_api("tasks", task, "complete", method="POST", token=reg["token"],
                             json_body={"state": "succeeded", "exit_code": 0})  # fmt: skip
    assert status == 200
    late = ("tasks", task, "artifacts", "late.txt")
    status, err = await gl_api(*late, method="PUT", body=b"too late", token=reg["token"])
    assert status == 409 and "already succeeded" in err["message"], err
    status, _ = await gl_api(*put, method="PUT", body=b"replaced", token=reg["token"])
    assert status == 409
    _, arts = await gl_api("jobs", job["id"], "artifacts", token=gl_tenants["ada"])
    assert [(a["name"], a["size"]) for a in arts["artifacts"]] == [("early.txt", 7)]


BAD = ["two\nlines", "right-to-left \u202eoverride", "isolate \u2066x\u2069", "bell \x07",
       "escape \x1b[2J", "carriage\rreturn", "tab\there", "line\u2028separator",
       "C1 \x9b31m"]  # fmt: skip


@pytest.mark.parametrize("text", BAD)
async def test_names_and_labels_with_control_or_bidi_characters_are_400(gl_api, text):
    jobs = [
        ({"command": ["true"], "name": text}, "name"),
        ({"command": ["true"], "labels": {"team": text}}, "labels.team"),
        ({"command": ["true"], "resources": {"selector": {"zone": text}}},
         "resources.selector.zone"),
        ({"command": ["true"], "resources": {"worker": text}}, "resources.worker"),
    ]  # fmt: skip
    for body, field in jobs:
        status, err = await gl_api("jobs", method="POST", json_body=body)
        assert status == 400 and err["field"] == field, (body, err)
    status, err = await gl_api("sessions", method="POST", json_body={"name": text})
    assert status == 400 and err["field"] == "name", err
    status, err = await gl_api("tokens", method="POST", json_body={"name": text, "role": "viewer"})
    assert status == 400 and err["field"] == "name", err
    assert (await gl_api("jobs"))[1]["jobs"] == []
    assert (await gl_api("sessions"))[1]["sessions"] == []


@pytest.mark.parametrize("text", BAD)
async def test_worker_reported_names_with_control_or_bidi_characters_are_400(gl_api, text):
    base = {"name": "box", "hostname": "h", "cpus": 1, "memory_bytes": 1 << 30,
            "version": "test"}  # fmt: skip
    for extra, field in [
        ({"name": text}, "name"),
        ({"hostname": text}, "hostname"),
        ({"version": text}, "version"),
        ({"labels": {"zone": text}}, "labels.zone"),
        ({"devices": [{**GPU, "name": text}]}, "devices"),
    ]:
        status, err = await gl_api("workers", "register", method="POST",
                                   json_body={**base, **extra}, token="join")  # fmt: skip
        assert status == 400 and err["field"] == field, (extra, err)
    assert (await gl_api("workers"))[1]["workers"] == []
    reg = await join(gl_api)
    _, job = await gl_api("jobs", method="POST", json_body={"command": ["true"]})
    task = (await acquire(gl_api, reg))[job["id"]]
    status, err = await gl_api("tasks", task, "artifacts", f"{text}.txt", method="PUT", body=b"x",
                               token=reg["token"])  # fmt: skip
    assert status == 400 and err["field"] == "name", err
    assert (await gl_api("jobs", job["id"], "artifacts"))[1]["artifacts"] == []


async def test_plain_unicode_names_and_labels_are_kept(gl_api):
    body = {"command": ["true"], "name": "Überprüfung 中文", "labels": {"team": "café ✓ עברית"}}
    status, job = await gl_api("jobs", method="POST", json_body=body)
    assert status == 201, job
    assert job["spec"]["labels"] == {"team": "café ✓ עברית"}
    reg = await join(gl_api, labels={"zone": "zürich"}, devices=[{**GPU, "name": "Ärger GPU"}])
    _, listing = await gl_api("workers")
    assert listing["workers"][0]["labels"] == {"zone": "zürich"}
    assert reg["worker_id"] == listing["workers"][0]["id"]
