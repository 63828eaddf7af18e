"""``.map`` over a worker killed mid-map (kill -9 of its agent): each item's result
is handed over exactly once; with retries only the lost calls run again.

Side effects are counted per item in a file every call appends to when it
finishes. Whether the killed worker's task processes die with it is the fencing's
business (docs/adr), so the in-flight calls of the killed worker may count twice;
no call whose outcome the control plane held before the kill may run again (a
call that finished a moment before, its outcome not yet shipped, may: ADR 0096).
"""

import collections
import os
import signal
import time
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import errors

from ..support import until

N = 24


def work(i: int, ledger: str, gate: str) -> int:
    time.sleep(0.2)
    if i >= 6 and i % 2:  # odd calls past 5 wait, so the kill finds some running
        while not os.path.exists(gate):
            time.sleep(0.05)
    with open(ledger, "a") as f:
        f.write(f"{i}\n")
    return i * i


def ran(ledger) -> collections.Counter[int]:
    text = ledger.read_text() if ledger.exists() else ""
    return collections.Counter(int(x) for x in text.split())


def held(conn, run) -> set[int]:
    """The items whose outcome the control plane holds: every call of a chunk that
    succeeded, and the kept result parts of the others (a chunk that succeeds between
    the two reads drops its parts, so this can only undercount)."""
    out: set[int] = set()
    start = 0
    for job_id in run.job_ids:
        job = conn.job(job_id)
        calls = job.spec.function.calls
        if job.state == "succeeded":
            out.update(range(start, start + calls))
        else:
            out.update(start + p.index for p in conn.result_parts(job_id).parts)
        start += calls
    return out


@pytest.fixture
def two_workers(fresh_cluster):
    cluster = fresh_cluster(workers=2, slots=2)
    with cluster.connection() as conn:
        yield cluster, conn


def test_a_map_with_retries_reruns_only_the_lost_calls(two_workers, tmp_path):
    cluster, conn = two_workers
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    fn = gl.remote(work, retries=2, connection=conn)
    items = [(i, str(ledger), str(gate)) for i in range(N)]
    run = fn.map(items, star=True, progress=False)
    until(lambda: sum(ran(ledger).values()) >= 6, 60, "the first calls to finish")
    until(lambda: any(w.running_tasks for w in conn.workers() if w.name == "local-1"), 30,
          "local-1 to be making calls")  # fmt: skip
    until(lambda: len(held(conn, run)) >= 4, 60, "the control plane to hold finished calls")
    finished_before = held(conn, run)  # outcomes the control plane holds (ADR 0096)
    cluster.stop_worker("local-1", signal.SIGKILL)
    gate.touch()

    assert list(run) == [i * i for i in range(N)]  # each result once, in order
    counts = ran(ledger)
    assert set(counts) == set(range(N))
    assert all(counts[i] == 1 for i in finished_before)  # finished calls never rerun
    twice = [i for i, n in counts.items() if n > 1]
    assert len(twice) <= 2, counts  # at most the killed worker's two slots' calls


def test_a_map_without_retries_hands_each_item_over_once(two_workers, tmp_path):
    cluster, conn = two_workers
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    fn = gl.remote(work, connection=conn)
    items = [(i, str(ledger), str(gate)) for i in range(N)]
    run = fn.map(items, star=True, progress=False, return_exceptions=True)
    until(lambda: sum(ran(ledger).values()) >= 6, 60, "the first calls to finish")
    cluster.stop_worker("local-1", signal.SIGKILL)
    gate.touch()

    results = list(run)
    assert len(results) == N
    for i, got in enumerate(results):
        if isinstance(got, errors.JobFailed):
            assert got.state == "lost"  # a call of the killed worker, said so
        else:
            assert got == i * i
    assert any(not isinstance(r, Exception) for r in results)


@pytest.fixture
def tmp_path(gl_shared_dir: Path) -> Path:
    """Tasks here leave files for the test (pids, beats, ledgers, gates): a folder
    the task user can write (``gl_shared_dir``), not pytest's 0700 ``tmp_path``."""
    return gl_shared_dir
