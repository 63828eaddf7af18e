"""A control plane whose storage fills up, on a real cluster: a job whose artifact
cannot be stored does not end ``succeeded`` and says why; a submit with a workdir
answers 507 naming the cause and nothing stored before is lost; once space is
freed, bundles and artifacts round-trip byte for byte; a corrupted download is
caught and never written.

The database and blobs live on a small tmpfs (the test skips, saying why, without
root): ``<data_dir>/blobs`` links into it and ``db_path`` points there.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import client, errors
from gpulayer.cli import main
from gpulayer.cluster import LocalCluster

from ..support import cluster_on_small_disk, fill, until

FAST = {"heartbeat_seconds": 0.5, "lease_seconds": 6.0}
MiB = 1024 * 1024
WRITE_ARTIFACT = (
    "import os, pathlib; p = pathlib.Path(os.environ['GPULAYER_ARTIFACTS']);"
    " (p / 'big.bin').write_bytes(os.urandom({size}))"
)
COPY_INPUT = (
    "import os, shutil; shutil.copy('data/input.bin',"
    " os.path.join(os.environ['GPULAYER_ARTIFACTS'], 'out/copy.bin'))"
)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[tuple[LocalCluster, Path]]:
    """A one-worker cluster whose database and blobs are on a 40 MiB tmpfs."""
    env = {"GPULAYER_STORAGE_RETRY_SECONDS": "2"}
    with cluster_on_small_disk(tmp_path, "40m", env=env, **FAST) as got:
        yield got


def ended(conn, job_id: str):
    return until(lambda: (j := conn.job(job_id)).state.terminal and j, 120, f"job {job_id}")


def test_a_full_control_plane_fails_the_job_names_the_cause_and_recovers(small_disk, tmp_path):
    cluster, disk = small_disk
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    payload = os.urandom(8 * MiB)
    (work / "data" / "input.bin").write_bytes(payload)
    with cluster.connection() as conn:
        first = client.submit(["python", "-c", WRITE_ARTIFACT.format(size=1000)], connection=conn)
        assert ended(conn, first.id).state == "succeeded"
        kept = conn.download_artifact(first.id, "big.bin")

        filler = fill(disk, leave_bytes=4 * MiB)
        job = client.submit(["python", "-c", WRITE_ARTIFACT.format(size=12 * MiB)], connection=conn)
        done = ended(conn, job.id)
        assert done.state == "failed", done
        assert done.reason is not None
        assert done.reason.startswith("artifact 'big.bin' not stored: HTTP 507 storage_full:")
        assert f"the control plane's disk is full ({cluster.data_dir / 'blobs'})" in done.reason
        assert done.attempts == 1  # not retried: the program did its work
        assert any("artifact 'big.bin' not stored" in line for line in job.logs())

        count = len(conn.jobs(limit=1000))
        with pytest.raises(errors.StorageFull, match=r"the control plane's disk is full \("):
            client.submit(["python", "-c", COPY_INPUT], workdir=work, connection=conn)
        assert len(conn.jobs(limit=1000)) == count  # nothing half-submitted
        assert conn.download_artifact(first.id, "big.bin") == kept  # nothing lost

        filler.unlink()
        cmd = ["python", "-c", "import os; os.makedirs(os.environ['GPULAYER_ARTIFACTS'] + '/out');"
               + COPY_INPUT]  # fmt: skip
        again = client.submit(cmd, workdir=work, connection=conn)
        assert ended(conn, again.id).state == "succeeded"
        seen: list[tuple[int, int | None]] = []
        (path,) = again.download(tmp_path / "dl", progress=lambda d, t: seen.append((d, t)))
        assert path == tmp_path / "dl" / "out" / "copy.bin"
        assert path.read_bytes() == payload  # the bundle and the artifact, byte for byte
        assert seen[-1] == (len(payload), len(payload))

        # A blob corrupted on the control plane's disk is caught, and not written.
        (art,) = conn.artifacts(again.id)
        stored = disk / "blobs" / art.sha256[:2] / art.sha256
        stored.write_bytes(b"X" + stored.read_bytes()[1:])
        with pytest.raises(errors.TransferError, match="arrived corrupt"):
            conn.download(again.id, tmp_path / "dl2")
        assert not (tmp_path / "dl2" / "out" / "copy.bin").exists()


def test_delete_and_gc_from_the_cli_free_blobs_and_survive_a_restart(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / "input.txt").write_text("shared input\n")
    args = ["--GpulayerApp.blob_grace_seconds=0", "--GpulayerApp.gc_interval_seconds=0.5"]
    with LocalCluster(tmp_path / "c", workers=1, server_args=args, **FAST) as cluster:
        blobs = cluster.data_dir / "blobs"
        with cluster.connection() as conn:
            copy = ["sh", "-c", 'cp input.txt "$GPULAYER_ARTIFACTS/out-$GPULAYER_JOB_ID.txt"']
            jobs = [client.submit(copy, workdir=work, connection=conn) for _ in range(3)]
            for job in jobs:
                assert ended(conn, job.id).state == "succeeded"
            bundle = conn.job(jobs[0].id).spec.bundle
            assert bundle is not None and all(conn.job(j.id).spec.bundle == bundle for j in jobs)

            cli = ["--url", cluster.url, "--token", cluster.admin_token]
            assert main([*cli, "delete", jobs[0].id]) == 0
            assert capsys.readouterr().out == f"{jobs[0].id} deleted\n"
            with pytest.raises(errors.NotFound):
                conn.job(jobs[0].id)
            assert (blobs / bundle[:2] / bundle).exists()  # two jobs still name it

            cluster.restart_control_plane()
            assert main([*cli, "gc", "--keep-jobs", "1"]) == 0
            assert capsys.readouterr().out.startswith("deleted 1 job(s) and 0 blob(s)")
            assert [j.id for j in conn.jobs()] == [jobs[2].id]
            assert main([*cli, "delete", jobs[2].id]) == 0
            # the periodic collection would find nothing more: every blob is gone
            until(lambda: not any(p.is_file() for p in blobs.rglob("*")), 30, "blobs deleted")

            refused = client.submit(["sleep", "30"], connection=conn)
            assert main([*cli, "delete", refused.id]) == 1
            err = capsys.readouterr().err
            assert err.startswith("gpulayer: error: job ") and "only a finished job" in err
            conn.cancel(refused.id)
            again = client.submit(copy, workdir=work, connection=conn)
            assert ended(conn, again.id).state == "succeeded"
            (path,) = again.download(tmp_path / "dl")
            assert path.read_text() == "shared input\n"
