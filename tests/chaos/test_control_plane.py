"""Chaos: the control plane is killed (kill -9) and started again while jobs run,
while a burst of submits is under way, and while a ``.map`` runs. Each test checks
the three invariants of :mod:`.harness`."""

import signal
from collections.abc import Iterator

import pytest

import gpulayer as gl
from gpulayer.cluster import LocalCluster

from ..support import until
from .harness import (
    Waiter,
    acknowledged,
    ended,
    ends_sensibly,
    logs_once,
    map_logs_once,
    map_once,
    numbered_call,
    once,
    wait_lines,
)

N, HOLD = 8, 3


@pytest.fixture(scope="module")
def crashy(tmp_path_factory) -> Iterator[LocalCluster]:
    """A cluster whose control plane the tests kill. The lease outlasts a restart on a
    loaded machine, so running tasks ride through it (docs/faults.md)."""
    with LocalCluster(
        tmp_path_factory.mktemp("crashy"), workers=1, slots=8,
        heartbeat_seconds=0.5, lease_seconds=30.0,
    ) as c:  # fmt: skip
        yield c


def crash(cluster: LocalCluster) -> None:
    cluster.restart_control_plane(signal.SIGKILL)


def test_kill_9_of_the_control_plane_mid_job(crashy, ledger):
    with crashy.connection() as conn:
        gated = [gl.submit(ledger.numbered(N, HOLD), connection=conn) for _ in range(3)]
        streaming = gl.submit(ledger.numbered(300, pause=0.01), connection=conn)
        ids = [j.id for j in [*gated, streaming]]
        for job_id in ids:
            wait_lines(conn, job_id, HOLD)
        before = acknowledged(conn, ids)
        crash(crashy)  # the streaming job prints on meanwhile: its worker holds the lines
        ledger.open_gate()

        jobs = ended(conn, ids)
        ends_sensibly(jobs)
        assert all(j.attempts == 1 for j in jobs.values())  # rode through, not retried
        once(ledger, jobs)
        logs_once(conn, ledger, jobs, N, before, lines={streaming.id: 300})


def test_kill_9_of_the_control_plane_mid_burst_of_submits(crashy, ledger):
    """Four threads submit; the control plane dies under them. Every job a client was
    told of exists once, ran once and logged each line once; nothing else was stored."""
    with crashy.connection() as conn:
        conn.health()
        told: list[str] = []
        per_thread = 25

        def burst(t: int) -> None:
            for i in range(per_thread):
                cmd = ledger.numbered(3)
                told.append(gl.submit(cmd, name=f"burst-{t}-{i}", connection=conn).id)

        submitters = [Waiter(lambda t=t: burst(t)) for t in range(4)]
        for s in submitters:
            s.start()
        until(lambda: len(told) >= 12, 60, "the burst to be under way")
        crash(crashy)
        assert len(told) < 4 * per_thread, "the burst was over before the crash"
        for s in submitters:
            s.answer()

        assert len(told) == len(set(told)) == 4 * per_thread
        stored = [j.id for j in conn.jobs(limit=10000) if (j.spec.name or "").startswith("burst-")]
        assert sorted(stored) == sorted(told)  # nothing stored that nobody was told of
        jobs = ended(conn, told)
        ends_sensibly(jobs)
        once(ledger, jobs)
        logs_once(conn, ledger, jobs, 3)


def test_kill_9_of_the_control_plane_mid_map(crashy, ledger):
    items = 24
    with crashy.connection() as conn:
        fn = gl.remote(numbered_call, connection=conn)
        args = [(i, str(ledger.folder), 2, i >= 12) for i in range(items)]
        run = fn.map(args, star=True, progress=False, return_exceptions=True)
        until(lambda: sum(1 for e in ledger.entries() if e.startswith("item-")) >= 12, 60,
              "the first half of the calls to finish")  # fmt: skip
        before = acknowledged(conn, run.job_ids)
        crash(crashy)
        ledger.open_gate()

        results = list(run)
        map_once(ledger, results, failed_ok=lambda e: False)
        jobs = ended(conn, run.job_ids)
        ends_sensibly(jobs)
        map_logs_once(conn, run.job_ids, 2, before)
