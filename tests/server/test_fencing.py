"""Attempt numbers are fencing tokens (docs/adr/0082-fencing.md), over real HTTP.

Once a task is given up as ``lost`` (or a newer attempt replaced it), everything its
worker still sends about it (logs, metrics, artifacts, results, its completion) is
refused with 409 ``stale_attempt`` and changes nothing; the current attempt's
reports are taken as usual.
"""

from datetime import UTC, datetime

from .test_worker_handlers import JOB, join, lines, rejoin


async def acquire(gl_api, reg):
    status, got = await gl_api(
        "workers", reg["worker_id"], "acquire", method="POST", token=reg["token"]
    )
    assert status == 200, got
    [a] = got["assignments"]
    return a


async def stale_reports(gl_api, token, task_id):
    """Every kind of report about ``task_id``, as ``{what: (status, body)}``."""
    now = datetime.now(UTC).isoformat()
    point = {"rank": 0, "step": 1, "ts": now, "metrics": {"loss": 1.0}}
    return {
        "logs": await gl_api(
            "tasks", task_id, "logs", method="POST", token=token,
            json_body={"seq": 0, "lines": lines("from the old attempt")},
        ),
        "metrics": await gl_api(
            "tasks", task_id, "metrics", method="POST", token=token,
            json_body={"seq": 0, "points": [point]},
        ),
        "artifact": await gl_api(
            "tasks", task_id, "artifacts", "model.bin", method="PUT", body=b"old", token=token
        ),
        "result": await gl_api(
            "tasks", task_id, "result", method="PUT", body=b"old result", token=token,
            headers={"Content-Type": "application/octet-stream"},
        ),
        "complete": await gl_api(
            "tasks", task_id, "complete", method="POST", token=token,
            json_body={"state": "succeeded", "exit_code": 0},
        ),
    }  # fmt: skip


async def test_reports_of_a_lost_attempt_are_refused_and_the_retry_owns_the_job(gl_api):
    reg = await join(gl_api)
    _, job = await gl_api("jobs", method="POST", json_body={**JOB, "retries": 1})
    first = await acquire(gl_api, reg)
    # The worker comes back without the task (a restart): attempt 1 is lost, attempt 2 runs.
    reg = await rejoin(gl_api, reg)
    second = await acquire(gl_api, reg)
    assert (first["attempt"], second["attempt"]) == (1, 2)

    refused = await stale_reports(gl_api, reg["token"], first["task_id"])
    for what, (status, err) in refused.items():
        assert status == 409, what
        assert err["code"] == "stale_attempt", what
        assert "given up as lost" in err["message"], what

    tok = reg["token"]
    status, _ = await gl_api(
        "tasks", second["task_id"], "artifacts", "model.bin", method="PUT", body=b"new", token=tok
    )
    assert status == 201
    status, task = await gl_api(
        "tasks",
        second["task_id"],
        "complete",
        method="POST",
        token=tok,
        json_body={"state": "succeeded", "exit_code": 0},
    )
    assert status == 200 and task["state"] == "succeeded"
    _, info = await gl_api("jobs", job["id"])
    assert info["state"] == "succeeded"
    assert [(t["attempt"], t["state"]) for t in info["tasks"]] == [(1, "lost"), (2, "succeeded")]
    _, page = await gl_api("jobs", job["id"], "logs")
    assert "from the old attempt" not in [ln["text"] for ln in page["lines"]]
    status, data = await gl_api("jobs", job["id"], "artifacts", "model.bin")
    assert data == b"new"
    _, metrics = await gl_api("jobs", job["id"], "metrics")
    assert metrics["points"] == []


async def test_a_late_completion_of_a_lost_task_does_not_change_its_ended_job(gl_api):
    reg = await join(gl_api)
    _, job = await gl_api("jobs", method="POST", json_body=JOB)  # no retries
    first = await acquire(gl_api, reg)
    reg = await rejoin(gl_api, reg)
    _, info = await gl_api("jobs", job["id"])
    assert info["state"] == "lost"
    status, err = await gl_api(
        "tasks",
        first["task_id"],
        "complete",
        method="POST",
        token=reg["token"],
        json_body={"state": "succeeded", "exit_code": 0},
    )
    assert status == 409 and err["code"] == "stale_attempt"
    _, again = await gl_api("jobs", job["id"])
    assert (again["state"], again["ended_at"]) == ("lost", info["ended_at"])


async def test_a_repeated_completion_of_the_current_attempt_is_still_idempotent(gl_api):
    reg = await join(gl_api)
    await gl_api("jobs", method="POST", json_body=JOB)
    a = await acquire(gl_api, reg)
    body = {"state": "failed", "exit_code": 2, "reason": "exit code 2"}
    for _ in range(2):
        status, task = await gl_api(
            "tasks", a["task_id"], "complete", method="POST", token=reg["token"], json_body=body
        )
        assert status == 200 and task["state"] == "failed"
