"""Per-owner quotas through a real Jupyter server with the extension: queued jobs per
owner (429 ``quota_exceeded`` naming the limit and its trait) and log text per job
(later lines dropped, one marker line, the job not failed)."""

import pytest

from .test_limits import running_task
from .test_worker_handlers import lines

UNPLACEABLE = {"command": ["true"], "resources": {"gpus": 8}}


@pytest.fixture
def jp_server_config(jp_server_config):
    config = {**jp_server_config, "GpulayerApp": dict(jp_server_config["GpulayerApp"])}
    config["GpulayerApp"].update(max_queued_jobs_per_owner=3, max_log_bytes_per_job=1000)
    return config


async def test_an_owner_may_have_only_so_many_jobs_queued(gl_api):
    ids = []
    for _ in range(3):
        status, job = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
        assert status == 201
        ids.append(job["id"])
    status, err = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
    assert status == 429 and err["code"] == "quota_exceeded", err
    assert "at most 3" in err["message"] and "max_queued_jobs_per_owner" in err["message"]
    # another owner has its own quota
    _, ada = await gl_api("tokens", method="POST", json_body={"name": "ada", "role": "submitter"})
    status, _ = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=ada["token"])
    assert status == 201
    # a batch is all or nothing
    status, err = await gl_api(
        "jobs", "batch", method="POST", token=ada["token"], json_body={"jobs": [UNPLACEABLE] * 3}
    )
    assert status == 429 and err["code"] == "quota_exceeded"
    _, page = await gl_api("jobs", params={"limit": "100"})
    assert len(page["jobs"]) == 4
    # a cancelled job frees its place
    await gl_api("jobs", ids[0], "cancel", method="POST")
    status, _ = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
    assert status == 201


async def test_a_job_keeps_so_much_log_then_one_marker_and_still_succeeds(gl_api):
    _, tok, tid = await running_task(gl_api)

    async def send(seq, *texts):
        status, ack = await gl_api(
            "tasks", tid, "logs", method="POST", token=tok,
            json_body={"seq": seq, "lines": lines(*texts)},
        )  # fmt: skip
        assert status == 200, ack
        return ack["next_seq"]

    assert await send(0, *["a" * 99] * 5) == 5  # 495 bytes
    assert await send(5, *["é" * 50] * 6) == 11  # 100 bytes each: 5 fit, then the marker
    assert await send(11, "more", "and more") == 13  # taken (so not resent), dropped
    status, done = await gl_api(
        "tasks", tid, "complete", method="POST", token=tok,
        json_body={"state": "succeeded", "exit_code": 0},
    )  # fmt: skip
    assert status == 200 and done["state"] == "succeeded"
    _, page = await gl_api("jobs", done["job_id"], "logs")
    texts = [ln["text"] for ln in page["lines"]]
    assert texts[:10] == ["a" * 99] * 5 + ["é" * 50] * 5
    [marker] = texts[10:]
    assert "limit of 1000 bytes" in marker and "max_log_bytes_per_job" in marker
    assert page["lines"][-1]["stream"] == "system" and page["complete"]
