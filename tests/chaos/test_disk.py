"""Chaos: the control plane's disk fills up while jobs run (its database and blobs on
a small tmpfs; the test skips, saying why, without root), then space is freed.
Checks the three invariants of :mod:`.harness`."""

from collections.abc import Iterator
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import contracts
from gpulayer.cluster import LocalCluster

from ..support import cluster_on_small_disk, fill, until
from .harness import acknowledged, ended, ends_sensibly, logs_once, once, wait_lines

N, HOLD = 40, 3


@pytest.fixture
def small_disk(tmp_path) -> Iterator[tuple[LocalCluster, Path]]:
    """A one-worker cluster whose database and blobs are on a 32 MiB tmpfs."""
    with cluster_on_small_disk(tmp_path, "32m", heartbeat_seconds=0.5, lease_seconds=6.0) as got:
        yield got


def names_the_disk(job: contracts.Job) -> bool:
    return job.state == contracts.JobState.failed and "disk is full" in (job.reason or "")


def test_the_control_planes_disk_fills_up_mid_job(small_disk, ledger):
    """Some jobs finish while the disk is full (their lines and ends wait in the worker);
    others still run when the worker, its heartbeats refused, stops them (they are
    retried once space is back)."""
    cluster, disk = small_disk
    worker_log = cluster.log_path("local-1")
    with cluster.connection() as conn:
        quick = [submit(conn, ledger, "quick") for _ in range(2)]
        held = [submit(conn, ledger, "gate") for _ in range(2)]
        ids = [j.id for j in [*quick, *held]]
        for job_id in ids:
            wait_lines(conn, job_id, HOLD)
        before = acknowledged(conn, ids)
        filler = fill(disk)
        until(lambda: "storage_full" in worker_log.read_text(), 60,
              "the worker to be refused for lack of space")  # fmt: skip
        ledger.open_gate("quick")  # they print on and finish while nothing can be stored
        until(lambda: len(ledger.entries()) == len(quick), 60, "the quick jobs to finish")
        until(lambda: "no heartbeat answered" in worker_log.read_text(), 60,
              "the worker to stop the held jobs (its lease may be lost)")  # fmt: skip
        filler.unlink()
        ledger.open_gate()

        jobs = ended(conn, ids)
        ends_sensibly(jobs, failure=names_the_disk)
        for job in quick:
            assert jobs[job.id].attempts == 1  # its end waited for space, then counted
        once(ledger, jobs)
        logs_once(conn, ledger, jobs, N, before)


def submit(conn, ledger, gate: str) -> gl.Job:
    return gl.submit(ledger.numbered(N, HOLD, pause=0.02, gate=gate), retries=1, connection=conn)
