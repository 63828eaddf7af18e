"""Chaos: workers die (kill -9 of the agent) or freeze (SIGSTOP past the lease) while
their jobs run. Each test checks the three invariants of :mod:`.harness`."""

import os
import signal

import psutil
import pytest

import gpulayer as gl
from gpulayer import contracts

from ..support import until
from .harness import (
    acknowledged,
    alive,
    ended,
    ends_sensibly,
    finished_items,
    logs_once,
    map_logs_once,
    map_once,
    numbered_call,
    once,
    wait_lines,
)

N, HOLD = 8, 3  # lines per job; each waits for the gate before line HOLD


def lost_with_its_worker(job: contracts.Job) -> bool:
    """A job without retries whose worker died: ``lost``, saying the lease ran out."""
    return job.state == contracts.JobState.lost and "lease" in (job.reason or "")


def submit(conn, ledger, retries: int = 0) -> gl.Job:
    return gl.submit(ledger.numbered(N, HOLD), retries=retries, connection=conn)


def retries_started(conn, ledger, jobs) -> None:
    """Until attempt 2 of each job runs its program (then the gate may open: attempt 1,
    stopped before it, can never do its side effect if it died as it should)."""
    until(
        lambda: all(
            any(t.attempt == 2 and ledger.note(t.id, "start") for t in conn.job(j.id).tasks)
            for j in jobs
        ),
        timeout=90,
        what="the retries to start",
    )


def test_kill_9_of_a_worker_mid_task(plane, workers, ledger):
    victim = plane.add_worker("k9-victim", slots=4)
    workers.append("k9-victim")
    with plane.connection() as conn:
        retried = [submit(conn, ledger, retries=1) for _ in range(2)]
        single = submit(conn, ledger)  # no retries
        streaming = gl.submit(ledger.numbered(400, pause=0.01), retries=1, connection=conn)
        ids = [j.id for j in [*retried, single, streaming]]
        for job_id in ids:
            wait_lines(conn, job_id, HOLD)
        before = acknowledged(conn, ids)
        plane.add_worker("k9-spare", slots=4)
        workers.append("k9-spare")
        os.kill(victim.pid, signal.SIGKILL)
        retries_started(conn, ledger, retried)
        ledger.open_gate()

        jobs = ended(conn, ids)
        ends_sensibly(jobs, failure=lambda j: j.id == single.id and lost_with_its_worker(j))
        for job in [*retried, streaming]:
            got = [(t.attempt, t.state, t.worker_name) for t in jobs[job.id].tasks]
            assert got == [(1, "lost", "k9-victim"), (2, "succeeded", "k9-spare")]
        once(ledger, jobs)
        logs_once(conn, ledger, jobs, N, before, lines={streaming.id: 400})


def test_sigstop_of_a_worker_past_its_lease(plane, workers, ledger):
    frozen = plane.add_worker("frozen", slots=4)
    workers.append("frozen")
    with plane.connection() as conn:
        retried = [submit(conn, ledger, retries=1) for _ in range(2)]
        single = submit(conn, ledger)
        ids = [j.id for j in [*retried, single]]
        for job_id in ids:
            wait_lines(conn, job_id, HOLD)
        before = acknowledged(conn, ids)
        plane.add_worker("thawed-spare", slots=4)
        workers.append("thawed-spare")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            retries_started(conn, ledger, retried)
            ledger.open_gate()
            jobs = ended(conn, ids)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        ends_sensibly(jobs, failure=lambda j: j.id == single.id and lost_with_its_worker(j))
        once(ledger, jobs)
        logs_once(conn, ledger, jobs, N, before)
        # Thawed, it reports its tasks late: nothing it says changes a job or a log.
        until(
            lambda: {w.name: w.state for w in conn.workers()}["frozen"] == "ready",
            timeout=60,
            what="the thawed worker to be ready again",
        )
        again = ended(conn, ids)
        assert {j.id: j.state for j in again.values()} == {j.id: j.state for j in jobs.values()}
        once(ledger, again)
        logs_once(conn, ledger, again, N, before)


@pytest.mark.parametrize("retries", [0, 1])
def test_kill_9_of_a_worker_mid_map(plane, workers, ledger, retries):
    """Chunks of four calls; in each, two finish (their outcomes acknowledged) and two
    hang when the worker dies. The finished calls are handed over once and never run
    again; the others fail as ``lost``, or with retries run once more, elsewhere."""
    victim = plane.add_worker(f"map-victim-{retries}", slots=2)
    workers.append(f"map-victim-{retries}")
    items, size = 16, 4
    with plane.connection() as conn:
        fn = gl.remote(numbered_call, retries=retries, connection=conn)
        args = [(i, str(ledger.folder), 2, i % size >= 2) for i in range(items)]
        run = fn.map(args, star=True, chunk_size=size, progress=False, return_exceptions=True)
        on_victim = until(lambda: running_with_parts(conn, run.job_ids, 2), 60,
                          "two chunks to run, each with two calls' outcomes kept")  # fmt: skip
        finished = finished_items(ledger)
        before = acknowledged(conn, run.job_ids)
        plane.add_worker(f"map-spare-{retries}", slots=2)
        workers.append(f"map-spare-{retries}")
        tree = [p.pid for p in psutil.Process(victim.pid).children(recursive=True)]
        os.kill(victim.pid, signal.SIGKILL)
        until(lambda: not any(alive(p) for p in tree), 10, "the victim's runners to die")
        ledger.open_gate()

        results = list(run)
        lost = {i for i, r in enumerate(results) if isinstance(r, BaseException)}
        assert not lost & finished  # every call that finished is handed over
        if retries:
            assert not lost
        else:  # exactly the killed chunks' unfinished calls
            assert lost == {i for c in on_victim for i in range(c * size + 2, c * size + size)}
        map_once(ledger, results, failed_ok=lambda e: getattr(e, "state", "") == "lost")
        jobs = ended(conn, run.job_ids)
        ends_sensibly(jobs, failure=lambda j: not retries and lost_with_its_worker(j))
        map_logs_once(conn, run.job_ids, 2, before)


def running_with_parts(conn, job_ids: list[str], parts: int) -> list[int]:
    """The chunks (by position) running now, once two are and each has ``parts``
    outcomes kept; else []."""
    jobs = [conn.job(j) for j in job_ids]
    running = [k for k, j in enumerate(jobs) if j.state == "running"]
    if len(running) == 2 and all(jobs[k].result_parts == parts for k in running):
        return running
    return []
