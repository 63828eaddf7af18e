"""The worker protocol over real HTTP against the real control plane.

These tests play the worker's side of the protocol by hand so each step and
each refusal can be asserted; tests/integration runs the real agent.
"""

import asyncio
from datetime import UTC, datetime

from ..support import until_long_polls

JOB = {"command": ["python", "-c", "print('hi')"]}


def registration(name="box1", **kw):
    return {
        "name": name,
        "hostname": "host-" + name,
        "cpus": 4,
        "memory_bytes": 8 << 30,
        "version": "test",
        "slots": 2,
        **kw,
    }


def lines(*texts, stream="stdout"):
    now = datetime.now(UTC).isoformat()
    return [{"stream": stream, "ts": now, "text": t} for t in texts]


async def join(gl_api, name="box1", **kw):
    status, reg = await gl_api(
        "workers", "register", method="POST", json_body=registration(name, **kw), token="join"
    )
    assert status == 200, reg
    return reg


async def rejoin(gl_api, reg, name="box1", **kw):
    """A worker coming back (a restart): it registers again with its own token."""
    status, again = await gl_api(
        "workers", reg["worker_id"], "register", method="POST",
        json_body=registration(name, **kw), token=reg["token"],
    )  # fmt: skip
    assert status == 200, again
    return again


async def test_register_gives_a_worker_token_that_only_acts_for_itself(gl_api):
    reg = await join(gl_api)
    assert reg["token"].startswith("gl_") and reg["heartbeat_seconds"] == 0.5
    other = await join(gl_api, "box2")
    status, err = await gl_api(
        "workers", other["worker_id"], "heartbeat", method="POST", json_body={}, token=reg["token"]
    )
    assert status == 403 and err["code"] == "forbidden"
    status, err = await gl_api("jobs", method="POST", json_body=JOB, token=reg["token"])
    assert status == 403
    status, workers = await gl_api("workers")
    assert [(w["name"], w["state"]) for w in workers["workers"]] == [
        ("box1", "ready"),
        ("box2", "ready"),
    ]


async def test_a_join_token_registers_only_new_names(gl_api):
    first = await join(gl_api)
    status, err = await gl_api(
        "workers", "register", method="POST", json_body=registration(), token="join"
    )
    assert status == 409 and err["field"] == "name"
    assert "gpulayer workers forget box1" in err["message"]
    # The worker itself still acts: nothing was taken over.
    beat = ("workers", first["worker_id"], "heartbeat")
    assert (await gl_api(*beat, method="POST", json_body={}, token=first["token"]))[0] == 200


async def test_registering_again_with_its_own_token_keeps_the_id_and_the_token(gl_api):
    first = await join(gl_api)
    wid = first["worker_id"]
    status, again = await gl_api(
        "workers", wid, "register", method="POST", json_body=registration(), token=first["token"]
    )
    assert status == 200, again
    assert again["worker_id"] == wid and again["token"] == first["token"]
    beat = ("workers", wid, "heartbeat")
    assert (await gl_api(*beat, method="POST", json_body={}, token=first["token"]))[0] == 200
    # ...but never as another name, nor as another worker.
    status, err = await gl_api(
        "workers", wid, "register", method="POST", json_body=registration("box2"),
        token=first["token"],
    )  # fmt: skip
    assert status == 409 and err["field"] == "name"
    other = await join(gl_api, "box2")
    status, err = await gl_api(
        "workers", other["worker_id"], "register", method="POST",
        json_body=registration("box2"), token=first["token"],
    )  # fmt: skip
    assert status == 403 and err["code"] == "forbidden"


async def test_a_forgotten_worker_loses_its_token_tasks_and_name(gl_api):
    reg = await join(gl_api)
    wid, tok = reg["worker_id"], reg["token"]
    _, job = await gl_api("jobs", method="POST", json_body={**JOB, "retries": 1})
    status, got = await gl_api(
        "workers", wid, "acquire", method="POST", params={"wait": "0"}, token=tok
    )
    assert status == 200 and got["assignments"][0]["job_id"] == job["id"]
    status, _ = await gl_api("workers", "box1", method="DELETE")
    assert status == 204
    assert (await gl_api("workers"))[1]["workers"] == []
    assert (await gl_api("jobs", job["id"]))[1]["state"] == "queued"  # retried
    _, events = await gl_api("jobs", job["id"], "events")
    assert any("forgotten" in (e["reason"] or "") for e in events["events"])
    beat = ("workers", wid, "heartbeat")
    assert (await gl_api(*beat, method="POST", json_body={}, token=tok))[0] == 401
    # The name is free for a join token again (a reinstalled machine), under a new id.
    assert (await join(gl_api))["worker_id"] != wid
    assert (await gl_api("workers", "nobody", method="DELETE"))[0] == 404


async def test_bad_registration_is_400_naming_the_field(gl_api):
    status, err = await gl_api(
        "workers", "register", method="POST", json_body=registration(cpus=0), token="join"
    )
    assert status == 400 and err["field"] == "cpus"
    status, err = await gl_api(
        "workers", "register", method="POST", json_body=registration(gpus=2), token="join"
    )
    assert status == 400 and err["field"] == "gpus" and "unknown field" in err["message"]
    assert (await gl_api("workers"))[1]["workers"] == []


async def test_a_job_runs_through_the_protocol_end_to_end(gl_api, jp_serverapp):
    reg = await join(gl_api)
    wid, tok = reg["worker_id"], reg["token"]
    # The acquire long poll is open before the job exists and answers when it is placed.
    acquire = asyncio.ensure_future(
        gl_api("workers", wid, "acquire", method="POST", params={"wait": "5"}, token=tok)
    )
    await until_long_polls(jp_serverapp)
    _, job = await gl_api("jobs", method="POST", json_body=JOB)
    status, got = await acquire
    assert status == 200
    [a] = got["assignments"]
    assert a["job_id"] == job["id"] and a["attempt"] == 1 and a["spec"]["command"] == JOB["command"]
    tid = a["task_id"]
    assert (await gl_api("jobs", job["id"]))[1]["state"] == "running"

    status, ack = await gl_api(
        "tasks",
        tid,
        "logs",
        method="POST",
        token=tok,
        json_body={"seq": 0, "lines": lines("one", "two")},
    )
    assert status == 200 and ack == {"next_seq": 2}
    # A batch sent again after a lost answer, overlapping what is stored, adds only the new line.
    status, ack = await gl_api(
        "tasks",
        tid,
        "logs",
        method="POST",
        token=tok,
        json_body={"seq": 1, "lines": lines("two", "three")},
    )
    assert ack == {"next_seq": 3}
    status, art = await gl_api(
        "tasks", tid, "artifacts", "out/result.txt", method="PUT", body=b"42\n", token=tok
    )
    assert status == 201 and art["size"] == 3
    waiter = asyncio.ensure_future(gl_api("jobs", job["id"], "wait", params={"timeout": "5"}))
    status, task = await gl_api(
        "tasks",
        tid,
        "complete",
        method="POST",
        token=tok,
        json_body={"state": "succeeded", "exit_code": 0},
    )
    assert status == 200 and task["state"] == "succeeded"
    status, ended = await waiter
    assert status == 200 and ended["state"] == "succeeded" and ended["exit_code"] == 0
    assert ended["worker_name"] == "box1"

    _, page = await gl_api("jobs", job["id"], "logs")
    assert [(ln["offset"], ln["text"]) for ln in page["lines"]] == [
        (0, "one"),
        (1, "two"),
        (2, "three"),
    ]
    assert page["complete"] is True and page["next_offset"] == 3
    _, arts = await gl_api("jobs", job["id"], "artifacts")
    assert [a["name"] for a in arts["artifacts"]] == ["out/result.txt"]
    status, data = await gl_api("jobs", job["id"], "artifacts", "out/result.txt")
    assert status == 200 and data == b"42\n"
    # Completion is idempotent; late logs are refused.
    status, again = await gl_api(
        "tasks",
        tid,
        "complete",
        method="POST",
        token=tok,
        json_body={"state": "failed", "exit_code": 1},
    )
    assert status == 200 and again["state"] == "succeeded"
    status, err = await gl_api(
        "tasks", tid, "logs", method="POST", token=tok, json_body={"seq": 3, "lines": lines("late")}
    )
    assert status == 409 and "logs are closed" in err["message"]
    _, events = await gl_api("jobs", job["id"], "events")
    assert [e["state"] for e in events["events"]] == [
        "queued",
        "scheduled",
        "running",
        "running",
        "succeeded",
        "succeeded",
    ]


async def test_a_completion_carries_the_last_lines_stored_once_before_the_end(gl_api, jp_serverapp):
    reg = await join(gl_api)
    wid, tok = reg["worker_id"], reg["token"]
    acquire = asyncio.ensure_future(
        gl_api("workers", wid, "acquire", method="POST", params={"wait": "5"}, token=tok)
    )
    await until_long_polls(jp_serverapp)
    _, job = await gl_api("jobs", method="POST", json_body=JOB)
    [a] = (await acquire)[1]["assignments"]
    tid = a["task_id"]
    await gl_api("tasks", tid, "logs", method="POST", token=tok,
                 json_body={"seq": 0, "lines": lines("one")})  # fmt: skip
    done = {"state": "succeeded", "exit_code": 0, "logs": {"seq": 1, "lines": lines("two")}}
    status, task = await gl_api("tasks", tid, "complete", method="POST", token=tok, json_body=done)
    assert status == 200 and task["state"] == "succeeded"
    # The answer was lost: the worker sends the same completion again.
    status, _ = await gl_api("tasks", tid, "complete", method="POST", token=tok, json_body=done)
    assert status == 200
    _, page = await gl_api("jobs", job["id"], "logs")
    assert [ln["text"] for ln in page["lines"]] == ["one", "two"] and page["complete"] is True
    bad = {"state": "succeeded", "logs": {"seq": -1, "lines": []}}
    status, err = await gl_api("tasks", tid, "complete", method="POST", token=tok, json_body=bad)
    assert status == 400 and "logs.seq" in err["message"]


async def test_cancel_of_a_running_job_reaches_the_worker_through_acquire(gl_api, jp_serverapp):
    reg = await join(gl_api)
    wid, tok = reg["worker_id"], reg["token"]
    _, job = await gl_api("jobs", method="POST", json_body=JOB)
    _, got = await gl_api("workers", wid, "acquire", method="POST", token=tok)
    tid = got["assignments"][0]["task_id"]
    acquire = asyncio.ensure_future(
        gl_api("workers", wid, "acquire", method="POST", params={"wait": "5"}, token=tok)
    )
    await until_long_polls(jp_serverapp)
    status, j = await gl_api("jobs", job["id"], "cancel", method="POST")
    assert status == 200 and j["state"] == "running"
    status, got = await acquire
    assert status == 200 and got["cancel"] == [tid] and got["assignments"] == []
    await gl_api(
        "tasks",
        tid,
        "complete",
        method="POST",
        token=tok,
        json_body={"state": "cancelled", "reason": "cancelled by user"},
    )
    _, j = await gl_api("jobs", job["id"])
    assert j["state"] == "cancelled"
    status, _ = await gl_api(
        "workers", wid, "acquire", method="POST", params={"wait": "0.1"}, token=tok
    )
    assert status == 204


async def test_failed_task_is_retried_while_retries_remain(gl_api):
    reg = await join(gl_api)
    wid, tok = reg["worker_id"], reg["token"]
    _, job = await gl_api("jobs", method="POST", json_body={**JOB, "retries": 1})
    for attempt, final in ((1, "queued"), (2, "failed")):
        _, got = await gl_api("workers", wid, "acquire", method="POST", token=tok)
        [a] = got["assignments"]
        assert a["attempt"] == attempt
        await gl_api(
            "tasks",
            a["task_id"],
            "complete",
            method="POST",
            token=tok,
            json_body={"state": "failed", "exit_code": 3, "reason": "exit code 3"},
        )
        _, j = await gl_api("jobs", job["id"])
        assert j["state"] in (final, "scheduled")
    assert j["state"] == "failed" and j["exit_code"] == 3 and j["attempts"] == 2
    assert (
        "retrying"
        in [
            e["reason"]
            for e in (await gl_api("jobs", job["id"], "events"))[1]["events"]
            if e["state"] == "queued"
        ][1]
    )


async def test_heartbeat_names_tasks_to_kill_and_unknown_workers_are_404(gl_api):
    reg = await join(gl_api)
    status, reply = await gl_api(
        "workers",
        reg["worker_id"],
        "heartbeat",
        method="POST",
        token=reg["token"],
        json_body={"running_tasks": ["deadbeef0000"]},
    )
    assert status == 200 and reply == {"kill_tasks": ["deadbeef0000"], "cancel": []}
    status, err = await gl_api("workers", "nope", "acquire", method="POST", token="admin")
    assert status == 404 and "register again" in err["message"]


async def test_artifact_names_cannot_escape(gl_api):
    reg = await join(gl_api)
    await gl_api("jobs", method="POST", json_body=JOB)
    _, got = await gl_api("workers", reg["worker_id"], "acquire", method="POST", token=reg["token"])
    tid = got["assignments"][0]["task_id"]
    for bad in ("../x", "a/../../x", "a//b", "./x"):
        status, err = await gl_api(
            "tasks", tid, "artifacts", bad, method="PUT", body=b"x", token=reg["token"]
        )
        assert status in (400, 404), bad
        assert err["code"] in ("invalid", "not_found")
    job_id = got["assignments"][0]["job_id"]
    assert (await gl_api("jobs", job_id, "artifacts"))[1]["artifacts"] == []
    status, _ = await gl_api("blobs", "..%2F..%2Fgpulayer.db", token=reg["token"])
    assert status == 403  # a worker reads only its own tasks' bundles
    status, _ = await gl_api("blobs", "..%2F..%2Fgpulayer.db")
    assert status == 404


async def test_gpu_job_waits_with_a_reason_until_a_worker_has_gpus(gl_api):
    await join(gl_api)
    _, job = await gl_api("jobs", method="POST", json_body={**JOB, "resources": {"gpus": 1}})
    assert job["state"] == "queued"
    assert job["pending_reasons"] == ["box1: needs 1 × GPU, has no GPUs"]
    assert job["reason"] == "unsatisfiable: no registered worker could ever run this job"
    gpu = {
        "index": 0,
        "kind": "cuda",
        "name": "A100 (simulated)",
        "memory_bytes": 80 << 30,
        "simulated": True,
    }
    reg = await join(gl_api, "gpubox", devices=[gpu])
    _, got = await gl_api("workers", reg["worker_id"], "acquire", method="POST", token=reg["token"])
    assert got["assignments"][0]["gpu_indices"] == [0]


async def test_the_job_list_flags_a_job_no_worker_could_ever_run(gl_api):
    await join(gl_api)
    _, big = await gl_api("jobs", method="POST", json_body={**JOB, "resources": {"gpus": 1}})
    _, small = await gl_api("jobs", method="POST", json_body=JOB)
    _, listed = await gl_api("jobs")
    by_id = {j["id"]: j for j in listed["jobs"]}
    # the list says what the job's own answer says (the sidebar's cards read the list)
    assert by_id[big["id"]]["unsatisfiable"] is True
    never = "unsatisfiable: no registered worker could ever run this job"
    assert by_id[big["id"]]["reason"] == never
    assert by_id[small["id"]]["unsatisfiable"] is False  # it fits box1 (placed there)
    gang = {**JOB, "kind": "distributed", "nodes": 2}
    _, pair = await gl_api("jobs", method="POST", json_body=gang)
    _, listed = await gl_api("jobs", params={"state": "queued"})
    flagged = {j["id"]: j["reason"] for j in listed["jobs"] if j["unsatisfiable"]}
    assert flagged[pair["id"]].startswith("unsatisfiable: a gang of 2 nodes needs 2 workers")


async def test_a_resync_acquire_answers_at_once_and_a_bad_one_names_the_field(gl_api):
    """``acquire?resync=1`` (the worker's previous acquire broke) does not hold: an
    empty answer with a fresh seq (docs/adr/0150)."""
    reg = await join(gl_api)
    wid, tok = reg["worker_id"], reg["token"]
    acquire = ("workers", wid, "acquire")
    status, got = await gl_api(
        *acquire, method="POST", params={"wait": "30", "resync": "1"}, token=tok
    )
    assert status == 200 and got["assignments"] == [] and got["seq"] > 0
    status, again = await gl_api(
        *acquire, method="POST", params={"wait": "0", "resync": "1"}, token=tok
    )
    assert status == 200 and again["seq"] > got["seq"]
    status, err = await gl_api(
        *acquire, method="POST", params={"wait": "0", "resync": "yes"}, token=tok
    )
    assert status == 400 and err["field"] == "resync"
