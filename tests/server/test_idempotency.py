"""Idempotent submits (docs/adr/0085): ``Idempotency-Key`` through the real server and
store; expiry and pruning on the service with an injected clock."""

import functools

import pytest

from gpulayer.contracts import JobSpec
from gpulayer.errors import Conflict, QuotaExceeded
from jupyter_ext.core import Quotas

from .planes import plane_on

JOB = {"command": ["python", "-c", "print('once')"], "name": "once"}
OTHER = {"command": ["python", "-c", "print('twice')"], "name": "other"}


def key(k: str) -> dict[str, str]:
    return {"Idempotency-Key": k}


async def _count(gl_api) -> int:
    status, page = await gl_api("jobs", params={"limit": 1000})
    assert status == 200
    return len(page["jobs"])


async def test_a_repeated_submit_answers_the_same_job_and_stores_one(gl_api):
    status, first = await gl_api("jobs", method="POST", json_body=JOB, headers=key("k-1"))
    assert status == 201
    status, again = await gl_api("jobs", method="POST", json_body=JOB, headers=key("k-1"))
    assert status == 200
    assert again["id"] == first["id"]
    assert await _count(gl_api) == 1
    # Without a key every submit is a new job, as before.
    for _ in range(2):
        status, _job = await gl_api("jobs", method="POST", json_body=JOB)
        assert status == 201
    assert await _count(gl_api) == 3


async def test_the_same_key_with_another_body_is_a_409_naming_the_key(gl_api):
    status, first = await gl_api("jobs", method="POST", json_body=JOB, headers=key("k-2"))
    assert status == 201
    status, err = await gl_api("jobs", method="POST", json_body=OTHER, headers=key("k-2"))
    assert status == 409
    assert err["code"] == "conflict"
    assert err["field"] == "Idempotency-Key"
    assert "'k-2'" in err["message"] and first["id"] in err["message"]
    assert await _count(gl_api) == 1


async def test_keys_are_per_owner(gl_api):
    status, created = await gl_api(
        "tokens", method="POST", json_body={"name": "ada", "role": "submitter"}
    )
    assert status == 201
    status, mine = await gl_api("jobs", method="POST", json_body=JOB, headers=key("shared"))
    assert status == 201
    status, hers = await gl_api(
        "jobs", method="POST", json_body=OTHER, headers=key("shared"), token=created["token"]
    )
    assert status == 201  # another owner's key is another key, whatever the body
    assert hers["id"] != mine["id"] and hers["owner"] == "ada"
    status, hers_again = await gl_api(
        "jobs", method="POST", json_body=OTHER, headers=key("shared"), token=created["token"]
    )
    assert status == 200 and hers_again["id"] == hers["id"]
    assert await _count(gl_api) == 2


async def test_a_batch_has_one_key_for_all_its_jobs(gl_api):
    batch = {"jobs": [JOB, OTHER, JOB]}
    status, first = await gl_api("jobs", "batch", method="POST", json_body=batch,
                                 headers=key("b-1"))  # fmt: skip
    assert status == 201 and len(first["jobs"]) == 3
    status, again = await gl_api("jobs", "batch", method="POST", json_body=batch,
                                 headers=key("b-1"))  # fmt: skip
    assert status == 200
    assert [j["id"] for j in again["jobs"]] == [j["id"] for j in first["jobs"]]
    status, err = await gl_api("jobs", "batch", method="POST",
                               json_body={"jobs": [JOB, OTHER]}, headers=key("b-1"))  # fmt: skip
    assert status == 409 and err["field"] == "Idempotency-Key"
    assert await _count(gl_api) == 3


@pytest.mark.parametrize("bad", ["", "has space", "x" * 201, "tab\tkey"])
async def test_a_malformed_key_is_a_400_and_stores_nothing(gl_api, bad):
    status, err = await gl_api("jobs", method="POST", json_body=JOB, headers=key(bad))
    assert status == 400
    assert err["field"] == "Idempotency-Key"
    assert await _count(gl_api) == 0


# ------------------------------------------------- expiry, on the service itself


@pytest.fixture
def plane(tmp_path):
    return functools.partial(plane_on, tmp_path)


async def test_a_key_expires_after_idempotency_seconds_and_is_pruned(plane):
    spec = JobSpec(command=["true"])
    async with plane(idempotency_seconds=100.0) as (cp, clock):
        first = await cp.jobs.submit_once([spec], "ada", key="k")
        clock.now += 99.0
        again = await cp.jobs.submit_once([spec], "ada", key="k")
        assert again.replayed and again.jobs[0].id == first.jobs[0].id
        with pytest.raises(Conflict):
            await cp.jobs.submit_once([JobSpec(command=["false"])], "ada", key="k")
        clock.now += 2.0  # past the 100 s: the key is free again
        fresh = await cp.jobs.submit_once([JobSpec(command=["false"])], "ada", key="k")
        assert not fresh.replayed and fresh.jobs[0].id != first.jobs[0].id
        await cp.jobs.submit_once([spec], "ada", key="old")
        clock.now += 101.0  # both expired; the next keyed submit prunes them
        await cp.jobs.submit_once([spec], "ada", key="new")
        assert await cp.store.idempotency_key("ada", "k") is None
        assert await cp.store.idempotency_key("ada", "old") is None
        assert await cp.store.idempotency_key("ada", "new") is not None


async def test_a_repeat_answers_its_job_though_a_check_would_refuse_it_now(plane):
    # The client repeats a submit whose answer it lost; meanwhile the owner's queue
    # filled. The job was stored: the repeat answers it, not the quota's 429.
    spec = JobSpec(command=["true"])  # no worker: it stays queued
    async with plane(quotas=Quotas(queued_jobs_per_owner=1)) as (cp, _):
        first = await cp.jobs.submit_once([spec], "ada", key="k")
        with pytest.raises(QuotaExceeded):
            await cp.jobs.submit_once([spec], "ada", key="another")
        again = await cp.jobs.submit_once([spec], "ada", key="k")
        assert again.replayed and [j.id for j in again.jobs] == [first.jobs[0].id]
        assert len(await cp.store.list_jobs(None, 10)) == 1
