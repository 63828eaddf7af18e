"""A full or read-only disk under a real control plane: submits, uploads and log
batches answer 507 / 503 naming the cause, never "internal error"; nothing stored
before is lost, and things work again once space is back.

The data directory is a small tmpfs (the test skips, saying why, without root)."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_ext.store import Store
from jupyter_ext.transitions import submitted

from ..support import fill, tmpfs

JOB = {"command": ["true"], "name": "kept"}


@pytest.fixture
def gl_data_dir(tmp_path: Path) -> Iterator[Path]:
    """The control plane's data directory on a 3 MiB tmpfs."""
    with tmpfs(tmp_path / "disk", "3m") as disk:
        yield disk


async def test_a_full_disk_answers_507_naming_it_and_keeps_what_was_stored(gl_api, gl_data_dir):
    status, kept = await gl_api("jobs", method="POST", json_body=JOB)
    assert status == 201
    status, blob = await gl_api("blobs", method="POST", body=b"bundle" * 100)
    assert status == 201
    filler = fill(gl_data_dir)

    status, err = await gl_api("blobs", method="POST", body=os.urandom(200_000))
    assert status == 507, err
    assert err["code"] == "storage_full"
    assert err["message"].startswith("the control plane's disk is full (")
    assert str(gl_data_dir / "blobs") in err["message"]
    status, err = await gl_api("jobs", method="POST", json_body=JOB)
    assert (status, err["code"]) == (507, "storage_full"), err
    assert str(gl_data_dir) in err["message"]
    assert not list((gl_data_dir / "blobs" / "tmp").iterdir())  # no half-written upload

    status, page = await gl_api("jobs")  # reads still work, and nothing was lost
    assert status == 200 and [j["id"] for j in page["jobs"]] == [kept["id"]]

    filler.unlink()
    status, again = await gl_api("jobs", method="POST", json_body=JOB)
    assert status == 201, again
    status, ref = await gl_api("blobs", method="POST", body=b"bundle" * 100)
    assert (status, ref["sha256"]) == (201, blob["sha256"])
    status, page = await gl_api("jobs")
    assert [j["id"] for j in page["jobs"]] == [again["id"], kept["id"]]


async def test_a_read_only_blob_directory_answers_503_naming_it(gl_api, gl_data_dir):
    await gl_api("health")
    blobs = gl_data_dir / "blobs"
    subprocess.run(["mount", "--bind", str(blobs), str(blobs)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(blobs)], check=True)
        status, err = await gl_api("blobs", method="POST", body=b"data")
    finally:
        subprocess.run(["umount", str(blobs)], check=True)
    assert status == 503, err
    assert err["code"] == "storage_unavailable"
    assert err["message"] == f"the control plane's storage is read-only ({blobs}); retry later"
    status, _ = await gl_api("blobs", method="POST", body=b"data")
    assert status == 201


async def test_the_store_rolls_back_a_write_the_full_disk_refused(tmp_path):
    from gpulayer.errors import StorageFull

    with tmpfs(tmp_path / "disk", "1m") as disk:
        store = await Store(disk / "db" / "gpulayer.db").open()
        try:
            spec = '{"command": ["true"]}'
            await store.apply(submitted(1.0, "before", spec, "ada", 0))
            filler = fill(disk)
            with pytest.raises(StorageFull, match="disk is full"):
                for i in range(100):  # the first commit that needs a new page fails
                    await store.apply(submitted(2.0, f"j{i}", spec * 50, "ada", 0))
            assert [j.id for j in await store.list_jobs(None, 1000)][-1] == "before"
            filler.unlink()
            await store.apply(submitted(3.0, "after", spec, "ada", 0))
            assert (await store.get_job("after")) is not None
        finally:
            await store.close()
