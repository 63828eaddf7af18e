"""Deleting jobs and garbage collection against the real server and store: a
deleted job's rows and blob files are gone, blobs another job names stay, an
active job is refused with 409, and a collection applies the retention limits."""

import copy
import hashlib
import sqlite3
from pathlib import Path

import pytest

from .test_worker_handlers import join, lines

TABLES = ("jobs", "tasks", "events", "logs", "artifacts", "results", "metrics")
UNPLACEABLE = {"command": ["true"], "resources": {"gpus": 8}}


@pytest.fixture
def jp_server_config(jp_server_config):
    """No grace for unreferenced blobs and no periodic collection (tests ask)."""
    cfg = copy.deepcopy(jp_server_config)
    cfg["GpulayerApp"].update({"blob_grace_seconds": 0.0, "gc_interval_seconds": 0.0})
    return cfg


def rows_of(data_dir: Path, job_id: str) -> dict[str, int]:
    con = sqlite3.connect(f"file:{data_dir / 'gpulayer.db'}?mode=ro", uri=True)
    try:
        key = {"jobs": "id"}
        return {
            t: con.execute(f"SELECT COUNT(*) FROM {t} WHERE {key.get(t, 'job_id')} = ?",
                           (job_id,)).fetchone()[0]
            for t in TABLES
        }  # fmt: skip
    finally:
        con.close()


def blob_file(data_dir: Path, data: bytes) -> Path:
    sha = hashlib.sha256(data).hexdigest()
    return data_dir / "blobs" / sha[:2] / sha


async def run_job(gl_api, worker, spec, artifacts: dict[str, bytes]) -> str:
    """Submit ``spec`` and play the worker: logs, ``artifacts``, success."""
    status, job = await gl_api("jobs", method="POST", json_body=spec)
    assert status == 201, job
    tok = worker["token"]
    status, got = await gl_api(
        "workers", worker["worker_id"], "acquire", method="POST", params={"wait": "0"}, token=tok
    )
    (a,) = got["assignments"]
    tid = a["task_id"]
    body = {"seq": 0, "lines": lines("hello")}
    assert (await gl_api("tasks", tid, "logs", method="POST", json_body=body, token=tok))[0] == 200
    for name, data in artifacts.items():
        status, _ = await gl_api(
            "tasks", tid, "artifacts", name, method="PUT", body=data, token=tok
        )
        assert status == 201
    done = {"state": "succeeded", "exit_code": 0}
    assert (await gl_api("tasks", tid, "complete", method="POST", json_body=done, token=tok))[
        0
    ] == 200
    return str(job["id"])


async def test_delete_removes_the_job_rows_and_the_blobs_only_it_named(gl_api, gl_data_dir):
    worker = await join(gl_api)
    bundle = b"a bundle both jobs run"
    status, ref = await gl_api("blobs", method="POST", body=bundle)
    spec = {"command": ["true"], "bundle": ref["sha256"]}
    shared, own, theirs = b"same weights", b"only the first job's", b"only the second job's"
    first = await run_job(gl_api, worker, spec, {"model.pt": shared, "log.txt": own})
    second = await run_job(gl_api, worker, spec, {"model.pt": shared, "other.txt": theirs})
    assert all(rows_of(gl_data_dir, first)[t] for t in ("jobs", "tasks", "events", "logs"))

    status, _ = await gl_api("jobs", first, method="DELETE")
    assert status == 204
    assert rows_of(gl_data_dir, first) == dict.fromkeys(TABLES, 0)
    assert (await gl_api("jobs", first))[0] == 404
    assert not blob_file(gl_data_dir, own).exists()
    for data in (bundle, shared, theirs):  # the second job still names them
        assert blob_file(gl_data_dir, data).exists()
    status, data = await gl_api("jobs", second, "artifacts", "model.pt")
    assert (status, data) == (200, shared)

    assert (await gl_api("jobs", first, method="DELETE"))[0] == 404
    assert (await gl_api("jobs", second, method="DELETE"))[0] == 204
    for data in (bundle, shared, theirs):
        assert not blob_file(gl_data_dir, data).exists()


async def test_an_active_job_is_refused_with_409_and_kept(gl_api, gl_data_dir):
    status, job = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
    status, err = await gl_api("jobs", job["id"], method="DELETE")
    assert status == 409 and err["code"] == "conflict"
    assert err["message"] == (
        f"job {job['id']} is queued; only a finished job can be deleted (cancel it first)"
    )
    assert rows_of(gl_data_dir, job["id"])["jobs"] == 1
    status, _ = await gl_api("gc", method="POST", json_body={"max_jobs": 0, "max_age_seconds": 1})
    assert status == 200
    assert (await gl_api("jobs", job["id"]))[1]["state"] == "queued"


async def test_another_submitter_cannot_delete_a_job(gl_api):
    status, job = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
    await gl_api("jobs", job["id"], "cancel", method="POST")
    _, made = await gl_api("tokens", method="POST", json_body={"name": "eve", "role": "submitter"})
    status, err = await gl_api("jobs", job["id"], method="DELETE", token=made["token"])
    assert status == 404 and err["code"] == "not_found"
    _, viewer = await gl_api("tokens", method="POST", json_body={"name": "v", "role": "viewer"})
    assert (await gl_api("jobs", job["id"], method="DELETE", token=viewer["token"]))[0] == 403
    assert (await gl_api("jobs", job["id"]))[0] == 200


async def test_gc_keeps_the_newest_finished_jobs_and_drops_unnamed_blobs(gl_api, gl_data_dir):
    worker = await join(gl_api)
    old = await run_job(gl_api, worker, {"command": ["true"]}, {"a.bin": b"old output"})
    new = await run_job(gl_api, worker, {"command": ["true"]}, {"a.bin": b"new output"})
    _, queued = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
    await gl_api("blobs", method="POST", body=b"uploaded, never submitted")

    status, report = await gl_api("gc", method="POST", json_body={})  # nothing configured
    assert status == 200
    assert (report["jobs_deleted"], report["blobs_deleted"]) == (0, 1)  # only the orphan
    assert not blob_file(gl_data_dir, b"uploaded, never submitted").exists()

    status, report = await gl_api("gc", method="POST", json_body={"max_jobs": 1})
    assert (status, report["jobs_deleted"], report["blobs_deleted"]) == (200, 1, 1), report
    assert report["bytes_freed"] == len(b"old output")
    assert report["blob_bytes"] == len(b"new output")
    _, page = await gl_api("jobs")
    assert sorted(j["id"] for j in page["jobs"]) == sorted([new, queued["id"]])
    assert rows_of(gl_data_dir, old) == dict.fromkeys(TABLES, 0)

    status, err = await gl_api("gc", method="POST", json_body={"max_jobs": -1})
    assert status == 400 and err["field"] == "max_jobs"
    status, report = await gl_api("gc", method="POST", json_body={"max_bytes": 1})
    assert (report["jobs_deleted"], report["blob_bytes"]) == (1, 0)
    _, page = await gl_api("jobs")
    assert [j["id"] for j in page["jobs"]] == [queued["id"]]  # never an active job
