"""Sessions and cells through the real handlers, scheduler and store, with the test
playing the worker: placement on the session's worker and GPUs without a slot,
unique names, ending, idle expiry and interrupts."""

import copy

import pytest

from ..support import until_async

SIM_GPU = {"index": 0, "kind": "cuda", "name": "A100", "memory_bytes": 80 << 30}


@pytest.fixture
def jp_server_config(jp_server_config):
    cfg = copy.deepcopy(jp_server_config)
    cfg["GpulayerApp"].update({"session_idle_seconds": 600.0, "lease_seconds": 60.0,
                               "heartbeat_seconds": 20.0})  # fmt: skip
    return cfg


async def worker(gl_api, name="w1", slots=1):
    reg = {"name": name, "hostname": "h", "cpus": 4, "memory_bytes": 1 << 34, "version": "t",
           "slots": slots, "devices": [SIM_GPU, {**SIM_GPU, "index": 1}]}  # fmt: skip
    status, got = await gl_api("workers", "register", method="POST", json_body=reg, token="join")
    assert status == 200, got
    return got["worker_id"], got["token"]


async def acquire(gl_api, wid, token):
    status, got = await gl_api("workers", wid, "acquire", method="POST", params={"wait": "0"},
                               token=token)  # fmt: skip
    return got if status == 200 else {"assignments": [], "cancel": [], "interrupt": []}


def cell(source, session=None, **kw):
    return {"kind": "cell", "cell": {"source": source, "session": session}, **kw}


async def test_cells_run_on_the_session_worker_with_its_gpus_and_no_slot(gl_api):
    wid, tok = await worker(gl_api, slots=1)
    status, s = await gl_api("sessions", method="POST",
                             json_body={"name": "train", "resources": {"gpus": 1}})  # fmt: skip
    assert status == 201 and s["state"] == "scheduled" and s["idle_timeout"] == 600
    status, dup = await gl_api("sessions", method="POST", json_body={"name": "train"})
    assert status == 409 and "already running" in dup["message"]
    status, early = await gl_api("jobs", method="POST", json_body=cell("x = 1", "train"))
    assert status == 201 and early["state"] == "queued"  # waits for the kernel's task to run

    got = await acquire(gl_api, wid, tok)
    (a,) = got["assignments"]  # the session; the worker's only slot is now taken
    assert a["spec"]["kind"] == "session" and a["gpu_indices"] == [0]
    got = await acquire(gl_api, wid, tok)
    (c,) = got["assignments"]  # the cell, placed as soon as the session ran
    assert c["job_id"] == early["id"] and c["gpu_indices"] == [0]

    # A fresh cell (no session) needs a slot of its own: it waits, and says why.
    _, fresh = await gl_api("jobs", method="POST", json_body=cell("1"))
    _, fresh = await gl_api("jobs", fresh["id"])
    assert fresh["state"] == "queued" and fresh["pending_reasons"]

    _, listed = await gl_api("sessions")
    (one,) = listed["sessions"]
    assert (one["name"], one["state"], one["worker_name"], one["gpu_indices"]) == (
        "train",
        "running",
        "w1",
        [0],
    )

    status, none = await gl_api("jobs", method="POST", json_body=cell("1", "nope"))
    assert status == 404 and none["field"] == "cell.session"
    status, bad = await gl_api("jobs", method="POST", json_body=cell("1", "train", retries=1))
    assert status == 400 and "retries=0" in bad["message"]

    # Interrupt reaches the worker once, in its acquire answer.
    status, _ = await gl_api("jobs", early["id"], "interrupt", method="POST")
    assert status == 200
    got = await acquire(gl_api, wid, tok)
    assert got["interrupt"] == [c["task_id"]]
    assert (await acquire(gl_api, wid, tok))["interrupt"] == []
    done = {"state": "cancelled", "reason": "interrupted"}
    status, _ = await gl_api("tasks", c["task_id"], "complete", method="POST", json_body=done,
                             token=tok)  # fmt: skip
    assert status == 200
    status, _ = await gl_api("jobs", early["id"], "interrupt", method="POST")
    assert status == 409

    # Ending it: the worker is told, the name is free at once, new cells are refused.
    status, _ = await gl_api("sessions", "train", method="DELETE")
    assert status == 204
    assert (await acquire(gl_api, wid, tok))["cancel"] == [a["task_id"]]
    _, gone = await gl_api("sessions")
    assert gone["sessions"] == []
    await gl_api("tasks", a["task_id"], "complete", method="POST", token=tok,
                 json_body={"state": "succeeded", "reason": "session ended"})  # fmt: skip
    _, job = await gl_api("jobs", a["job_id"])
    assert job["state"] == "succeeded" and job["reason"] == "ended by admin"
    status, _ = await gl_api("jobs", method="POST", json_body=cell("2", "train"))
    assert status == 404


async def test_idle_sessions_end(gl_api, jp_serverapp):
    wid, tok = await worker(gl_api, slots=2)
    body = {"name": "brief", "idle_timeout": "1s"}
    status, s = await gl_api("sessions", method="POST", json_body=body)
    assert status == 201 and s["idle_timeout"] == 1.0
    (a,) = (await acquire(gl_api, wid, tok))["assignments"]

    async def cancelled():  # the sweep runs every 0.2 s; the worker keeps heartbeating
        got = await acquire(gl_api, wid, tok)
        if not got["cancel"]:
            await gl_api("workers", wid, "heartbeat", method="POST", token=tok,
                         json_body={"running_tasks": [a["task_id"]]})  # fmt: skip
        return got["cancel"]

    cancel = await until_async(cancelled, timeout=30, what="the idle session's cancel")
    assert cancel == [a["task_id"]]
    _, events = await gl_api("jobs", a["job_id"], "events")
    assert any("without a cell" in (e["reason"] or "") for e in events["events"])


async def submitter(gl_api, name):
    status, tok = await gl_api(
        "tokens", method="POST", json_body={"name": name, "role": "submitter"}
    )
    assert status == 201, tok
    return tok["token"]


async def test_session_names_are_per_owner_and_hidden_from_other_owners(gl_api):
    wid, tok = await worker(gl_api, slots=2)
    ada, bob = await submitter(gl_api, "ada"), await submitter(gl_api, "bob")
    status, a = await gl_api("sessions", method="POST", json_body={"name": "main"}, token=ada)
    assert status == 201 and a["owner"] == "ada"
    # bob's probe of ada's name says nothing, and bob can have a "main" of his own.
    status, _ = await gl_api("sessions", "main", token=bob)
    assert status == 404
    status, b = await gl_api("sessions", method="POST", json_body={"name": "main"}, token=bob)
    assert status == 201 and b["owner"] == "bob" and b["job_id"] != a["job_id"]
    status, dup = await gl_api("sessions", method="POST", json_body={"name": "main"}, token=bob)
    assert status == 409 and "already running" in dup["message"]
    got = await acquire(gl_api, wid, tok)
    kernels = {x["owner"]: x for x in got["assignments"]}  # the worker keys kernels by owner
    assert set(kernels) == {"ada", "bob"}

    # Each one's "main" is its own: listing, reading, running cells in it.
    for token, mine in ((ada, a), (bob, b)):
        _, listed = await gl_api("sessions", token=token)
        assert [s["job_id"] for s in listed["sessions"]] == [mine["job_id"]]
        _, one = await gl_api("sessions", "main", token=token)
        assert one["job_id"] == mine["job_id"]
    status, c = await gl_api("jobs", method="POST", json_body=cell("x = 1", "main"), token=bob)
    assert status == 201
    (placed,) = (await acquire(gl_api, wid, tok))["assignments"]
    assert placed["job_id"] == c["id"] and placed["owner"] == "bob"
    assert placed["spec"]["cell"]["session"] == "main"

    # An admin sees both, and names the owner to read one; a submitter cannot.
    _, everyone = await gl_api("sessions")
    assert sorted(s["owner"] for s in everyone["sessions"]) == ["ada", "bob"]
    status, _ = await gl_api("sessions", "main")
    assert status == 404  # the admin's own "main": there is none
    _, hers = await gl_api("sessions", "main", params={"owner": "ada"})
    assert hers["job_id"] == a["job_id"]
    status, _ = await gl_api("sessions", "main", params={"owner": "ada"}, token=bob)
    assert status == 404

    # Ending bob's "main" leaves ada's running.
    status, _ = await gl_api("sessions", "main", method="DELETE", token=bob)
    assert status == 204
    assert (await acquire(gl_api, wid, tok))["cancel"] == [kernels["bob"]["task_id"]]
    _, still = await gl_api("sessions", "main", token=ada)
    assert still["job_id"] == a["job_id"] and still["state"] == "running"
    status, _ = await gl_api("jobs", method="POST", json_body=cell("1", "main"), token=bob)
    assert status == 404
