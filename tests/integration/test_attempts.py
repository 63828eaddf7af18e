"""Logs per attempt with real workers: a job whose worker is killed (kill -9 of its
agent) is retried elsewhere; the combined log marks the second attempt, and
``--attempt N`` / ``Job.logs(attempt=N)`` show one attempt's lines."""

import signal
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import cli, contracts

from ..support import until

LINES = ["line 1", "line 2", "line 3"]


def command(tmp_path) -> str:
    """Attempt 1 prints three lines and waits (its worker dies meanwhile); attempt 2
    finds the marker and goes straight on."""
    marker, gate = tmp_path / "marker", tmp_path / "gate"
    return (
        "echo line 1; echo line 2; echo line 3; "
        f"if [ ! -e {marker} ]; then touch {marker}; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; fi; echo done"
    )


@pytest.fixture
def retried(fresh_cluster, tmp_path):
    """A job that ran attempt 1 on local-1 (killed) and attempt 2 on local-2."""
    cluster = fresh_cluster(workers=1, slots=2)
    conn = cluster.connection()
    job = gl.submit(command(tmp_path), retries=1, connection=conn)
    until(lambda: [ln.text for ln in conn.logs(job.id).lines][-3:] == LINES, 60,
          "attempt 1 to print its lines")  # fmt: skip
    cluster.stop_worker("local-1", signal.SIGKILL)
    cluster.add_worker("local-2")
    assert job.wait(timeout=120).state == contracts.JobState.succeeded
    yield cluster, conn, job
    (tmp_path / "gate").touch()  # let attempt 1's orphaned process end too
    conn.close()


def test_the_combined_log_marks_the_retry_and_attempts_read_alone(retried, capsys):
    cluster, _conn, job = retried
    combined = job.logs()
    marker = "── attempt 2 on local-2 (attempt 1 lost: worker stopped renewing the lease)"
    assert combined.count(marker) == 1
    at = combined.index(marker)
    first, second = combined[:at], combined[at + 1 :]
    assert [t for t in first if t.startswith("line")] == LINES
    assert [t for t in second if t.startswith("line") or t == "done"] == [*LINES, "done"]
    assert second[0].startswith("started on local-2")
    # Never silent: either every line attempt 1 printed arrived, or a gap says how many did not.
    if len([t for t in first if t.startswith("line")]) < len(LINES):
        assert any("lost when local-1 died" in t for t in first)

    assert job.logs(attempt=1) == first
    assert job.logs(attempt=2) == second

    assert cli.main(["logs", job.id, "--attempt", "2"], connection=cluster.connection()) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == [*LINES, "done"]
    assert "── attempt" not in out.err and "started on local-2" in out.err

    assert cli.main(["logs", job.id], connection=cluster.connection()) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == [*LINES, *LINES, "done"]
    assert marker in out.err.splitlines()

    follow = ["logs", job.id, "-f", "--attempt", "1"]
    assert cli.main(follow, connection=cluster.connection()) == 0
    assert capsys.readouterr().out.splitlines() == LINES


@pytest.fixture
def tmp_path(gl_shared_dir: Path) -> Path:
    """Tasks here leave files for the test (pids, beats, ledgers, gates): a folder
    the task user can write (``gl_shared_dir``), not pytest's 0700 ``tmp_path``."""
    return gl_shared_dir
