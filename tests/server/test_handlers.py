"""User routes through a real Jupyter server with the extension, real store and scheduler."""

import asyncio

from ..support import until_long_polls

JOB = {"command": ["python", "-c", "print('hi')"], "name": "hello"}


async def test_health_needs_no_token(jp_fetch):
    resp = await jp_fetch("gpulayer", "api", "v1", "health", headers={"Authorization": ""})
    assert resp.code == 200


async def test_submit_answers_201_with_location_and_lists_it(gl_api):
    status, job = await gl_api("jobs", method="POST", json_body=JOB)
    assert status == 201
    assert job["state"] == "queued"
    assert job["spec"]["name"] == "hello"
    assert job["owner"] == "admin"
    assert "no workers have registered" in job["pending_reasons"][0]
    status, page = await gl_api("jobs")
    assert status == 200
    assert [j["id"] for j in page["jobs"]] == [job["id"]]
    status, got = await gl_api("jobs", job["id"])
    assert got["id"] == job["id"]
    status, events = await gl_api("jobs", job["id"], "events")
    assert [e["state"] for e in events["events"]] == ["queued"]


async def test_location_header_points_at_the_job(jp_fetch, gl_api, gl_data_dir):
    import json

    await gl_api("health")
    token = (gl_data_dir / "admin.token").read_text().strip()
    resp = await jp_fetch(
        "gpulayer",
        "api",
        "v1",
        "jobs",
        method="POST",
        body=json.dumps(JOB),
        headers={"Authorization": f"Bearer {token}"},
    )
    job = json.loads(resp.body)
    assert resp.headers["Location"].endswith(f"/gpulayer/api/v1/jobs/{job['id']}")
    assert resp.headers["Location"].startswith("/a%40b/")


CALL = {"format": 1, "python": "3.11", "payload": "LQ=="}


async def test_bad_bodies_are_400_naming_the_field_and_store_nothing(gl_api):
    cases = [
        ({"command": ["true"], "bogus": 1}, "bogus"),
        ({"command": ["true"], "resources": {"gpus": "many"}}, "resources.gpus"),
        ({"command": ["true"], "resources": {"gpus": -1}}, "resources.gpus"),
        ({"command": ["true"], "timeout": "soon"}, "timeout"),
        ({"command": ["true"], "shell": "true"}, "body"),
        ({}, "body"),
        ({"kind": "distributed", "command": ["true"], "nodes": 0}, "nodes"),
    ]
    distributed = [
        ({"command": ["true"], "nodes": 2}, "need kind 'distributed'"),
        ({"kind": "distributed", "command": ["true"], "function": CALL}, "not several"),
        ({"kind": "distributed", "function": {**CALL, "calls": 2}}, "exactly one call"),
    ]
    for body, words in distributed:
        status, err = await gl_api("jobs", method="POST", json_body=body)
        assert status == 400 and words in err["message"], (body, err)
    for body, field in cases:
        status, err = await gl_api("jobs", method="POST", json_body=body)
        assert status == 400, body
        assert err["code"] == "invalid"
        assert err["field"] == field, (body, err)
        assert field.split(".")[-1] in err["message"] or field == "body"
    status, err = await gl_api("jobs", method="POST", body=b"{not json")
    assert status == 400 and "not valid JSON" in err["message"]
    status, err = await gl_api("jobs", method="POST", body=b"[1, 2]")
    assert status == 400 and "JSON object" in err["message"]
    status, page = await gl_api("jobs")
    assert page["jobs"] == []


async def test_oversized_body_is_413(gl_api):
    big = {"command": ["echo", "x" * 60000], "env": {"A": "y" * 10000}}
    status, err = await gl_api("jobs", method="POST", json_body=big)
    assert status == 413
    assert err["code"] == "too_large" and "at most" in err["message"]
    assert (await gl_api("jobs"))[1]["jobs"] == []


async def test_unknown_ids_are_404(gl_api):
    for parts in [
        ("jobs", "nope"),
        ("jobs", "nope", "logs"),
        ("jobs", "nope", "artifacts"),
        ("jobs", "nope", "events"),
        ("jobs", "nope", "wait"),
    ]:
        status, err = await gl_api(*parts)
        assert status == 404, parts
        assert err["code"] == "not_found" and "nope" in err["message"]
    status, err = await gl_api("jobs", "nope", "cancel", method="POST")
    assert status == 404


async def test_bad_query_arguments_are_400(gl_api):
    status, job = await gl_api("jobs", method="POST", json_body=JOB)
    status, err = await gl_api("jobs", params={"state": "sleeping"})
    assert status == 400 and err["field"] == "state"
    status, err = await gl_api("jobs", params={"limit": "lots"})
    assert status == 400 and err["field"] == "limit"
    status, err = await gl_api("jobs", job["id"], "logs", params={"offset": "-1"})
    assert status == 400 and err["field"] == "offset"


async def test_cancel_queued_then_cancel_again_is_409(gl_api):
    _, job = await gl_api("jobs", method="POST", json_body=JOB)
    status, cancelled = await gl_api("jobs", job["id"], "cancel", method="POST")
    assert status == 200 and cancelled["state"] == "cancelled"
    assert cancelled["reason"] == "cancelled by admin"
    status, err = await gl_api("jobs", job["id"], "cancel", method="POST")
    assert status == 409
    assert err["code"] == "invalid_transition" and "already cancelled" in err["message"]
    _, again = await gl_api("jobs", job["id"])
    assert again["state"] == "cancelled" and again["ended_at"] == cancelled["ended_at"]


async def test_wait_returns_204_when_the_hold_runs_out_and_200_when_the_job_ends(
    gl_api, jp_serverapp
):
    _, job = await gl_api("jobs", method="POST", json_body=JOB)
    status, _ = await gl_api("jobs", job["id"], "wait", params={"timeout": "0.2"})
    assert status == 204
    waiter = asyncio.ensure_future(gl_api("jobs", job["id"], "wait", params={"timeout": "5"}))
    await until_long_polls(jp_serverapp)  # the wait holds before the cancel lands
    await gl_api("jobs", job["id"], "cancel", method="POST")
    status, ended = await waiter
    assert status == 200 and ended["state"] == "cancelled"


async def test_answer_end_is_the_jobs_end_without_its_spec(gl_api, jp_serverapp):
    """``POST jobs?answer=end``: the ``JobEnd`` (how it ended or stands, its small
    result), not the whole job; any other ``answer`` is a 400 naming it, storing nothing."""
    status, end = await gl_api("jobs", method="POST", json_body=JOB, params={"answer": "end"})
    assert status == 201 and end["state"] == "queued" and "spec" not in end
    _, page = await gl_api("jobs")
    stored = len(page["jobs"])
    status, err = await gl_api("jobs", method="POST", json_body=JOB, params={"answer": "all"})
    assert status == 400 and err["field"] == "answer"
    assert len((await gl_api("jobs"))[1]["jobs"]) == stored
    params = {"answer": "end", "wait": "5"}
    waiter = asyncio.ensure_future(gl_api("jobs", method="POST", json_body=JOB, params=params))
    await until_long_polls(jp_serverapp)  # the submit holds before the cancel lands
    _, queued = await gl_api("jobs", params={"state": "queued"})
    (newest,) = [j for j in queued["jobs"] if j["id"] != end["id"]]
    await gl_api("jobs", newest["id"], "cancel", method="POST")
    status, ended = await waiter
    assert status == 201 and set(ended) >= {"id", "state", "reason"} and "spec" not in ended
    assert (ended["id"], ended["state"], ended["reason"]) == (
        newest["id"], "cancelled", "cancelled by admin",
    )  # fmt: skip


async def test_logs_of_a_queued_job_are_empty_and_incomplete(gl_api):
    _, job = await gl_api("jobs", method="POST", json_body=JOB)
    status, page = await gl_api("jobs", job["id"], "logs")
    assert status == 200
    assert page == {
        "api_version": "gpulayer.dev/v1alpha1",
        "lines": [],
        "next_offset": 0,
        "complete": False,
    }


async def test_bad_token_is_401_and_no_token_is_refused(gl_api, jp_fetch):
    status, err = await gl_api("jobs", token="gl_notatoken")
    assert status == 401 and err["code"] == "unauthenticated"
    resp = await jp_fetch(
        "gpulayer", "api", "v1", "jobs", headers={"Authorization": ""}, raise_error=False
    )
    assert resp.code in (401, 403)


async def test_jupyter_token_user_is_admin(jp_fetch):
    import json

    resp = await jp_fetch("gpulayer", "api", "v1", "jobs", method="POST", body=json.dumps(JOB))
    assert resp.code == 201
    assert json.loads(resp.body)["owner"]


async def test_join_token_cannot_submit(gl_api):
    status, err = await gl_api("jobs", method="POST", json_body=JOB, token="join")
    assert status == 403 and err["code"] == "forbidden"
    assert (await gl_api("jobs"))[1]["jobs"] == []


async def test_bundle_must_be_uploaded_first(gl_api):
    status, err = await gl_api("jobs", method="POST", json_body={**JOB, "bundle": "0" * 64})
    assert status == 400 and err["field"] == "bundle"
    status, ref = await gl_api("blobs", method="POST", body=b"some bytes")
    assert status == 201 and ref["size"] == 10
    status, job = await gl_api("jobs", method="POST", json_body={**JOB, "bundle": ref["sha256"]})
    assert status == 201 and job["spec"]["bundle"] == ref["sha256"]


async def test_blob_over_the_limit_is_413(gl_api):
    status, err = await gl_api("blobs", method="POST", body=b"x" * (1024 * 1024 + 1))
    assert status == 413 and err["code"] == "too_large"
