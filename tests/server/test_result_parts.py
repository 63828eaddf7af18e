"""Result parts (docs/adr/0096-result-parts.md), over real HTTP: a function task of
several calls ships each call's outcome as it finishes; the first attempt to finish
a call keeps it, a retry is told which calls not to make again, a superseded attempt
is refused, and a completion with a result drops only its own task's parts."""

import base64

from .test_fencing import acquire
from .test_handlers import CALL
from .test_worker_handlers import JOB, join, rejoin

CHUNK = {"kind": "function", "function": {**CALL, "calls": 3}, "retries": 1}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def post_parts(gl_api, token, task_id, *parts):
    body = {"parts": [{"index": i, "outcome": b64(data)} for i, data in parts]}
    return await gl_api("tasks", task_id, "parts", method="POST", token=token, json_body=body)


async def kept(gl_api, job_id):
    status, got = await gl_api("jobs", job_id, "parts")
    assert status == 200, got
    return [(p["index"], p["attempt"], base64.b64decode(p["outcome"])) for p in got["parts"]]


async def test_finished_calls_outlive_their_attempt_and_a_retry_skips_them(gl_api):
    reg = await join(gl_api)
    _, job = await gl_api("jobs", method="POST", json_body=CHUNK)
    first = await acquire(gl_api, reg)
    assert first["done_calls"] == []

    status, _ = await post_parts(gl_api, reg["token"], first["task_id"], (0, b"zero"))
    assert status == 204
    status, _ = await post_parts(gl_api, reg["token"], first["task_id"], (0, b"again"))
    assert status == 204  # a part sent twice (a resend) is kept once, as first sent
    assert await kept(gl_api, job["id"]) == [(0, 1, b"zero")]
    _, info = await gl_api("jobs", job["id"])
    assert info["result_parts"] == 1

    # The worker comes back without the task: attempt 1 is lost, attempt 2 runs.
    reg = await rejoin(gl_api, reg)
    second = await acquire(gl_api, reg)
    assert (second["attempt"], second["done_calls"]) == (2, [0])
    status, err = await post_parts(gl_api, reg["token"], first["task_id"], (1, b"late"))
    assert status == 409 and err["code"] == "stale_attempt"

    status, _ = await post_parts(gl_api, reg["token"], second["task_id"], (1, b"one"))
    assert status == 204
    assert await kept(gl_api, job["id"]) == [(0, 1, b"zero"), (1, 2, b"one")]
    status, task = await gl_api(
        "tasks", second["task_id"], "complete", method="POST", token=reg["token"],
        json_body={"state": "succeeded", "exit_code": 0, "result": b64(b"outcomes")},
    )  # fmt: skip
    assert status == 200 and task["state"] == "succeeded"
    # Its result holds attempt 2's calls; attempt 1's call is still only a part.
    assert await kept(gl_api, job["id"]) == [(0, 1, b"zero")]
    _, info = await gl_api("jobs", job["id"])
    assert (info["state"], info["result_parts"]) == ("succeeded", 1)
    status, err = await post_parts(gl_api, reg["token"], second["task_id"], (2, b"after"))
    assert status == 409  # nothing is added to a task after its end


async def test_bad_parts_are_400_naming_the_field(gl_api):
    reg = await join(gl_api)
    await gl_api("jobs", method="POST", json_body=CHUNK)
    chunk = await acquire(gl_api, reg)
    status, err = await post_parts(gl_api, reg["token"], chunk["task_id"], (3, b"x"))
    assert status == 400 and err["field"] == "parts.index", err
    assert "not in this task's payload of 3 call(s)" in err["message"]
    status, err = await post_parts(gl_api, reg["token"], chunk["task_id"], (-1, b"x"))
    assert status == 400 and err["field"].startswith("parts"), err

    await gl_api("jobs", method="POST", json_body=JOB)
    command = await acquire(gl_api, reg)
    status, err = await post_parts(gl_api, reg["token"], command["task_id"], (0, b"x"))
    assert status == 400 and err["field"] == "parts", err
    status, got = await gl_api("jobs", command["job_id"], "parts")
    assert status == 200 and got["parts"] == []
