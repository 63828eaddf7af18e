"""Clients ride through a control-plane crash (kill -9, then a fresh start) while
they wait: every waiter returns the right answer and prints each line of the job
exactly once (docs/user-guide.md, "When the control plane restarts").

Each test starts its waiters, sees them blocked on a job that waits for a gate
file, kills and restarts the control plane, then opens the gate.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import cells, contracts
from gpulayer.cluster import LocalCluster

from ..chaos.harness import Waiter, attempts
from ..support import Proxy, until

BEFORE = ["before 1", "before 2", "before 3"]
AFTER = ["after 1", "after 2", "after 3"]
JOIN_SECONDS = 120.0


@pytest.fixture(scope="module")
def rcluster(tmp_path_factory) -> Iterator[LocalCluster]:
    """A cluster of its own: these tests kill its control plane. The lease is long
    enough for the worker to come back under a loaded CI machine."""
    c = LocalCluster(
        tmp_path_factory.mktemp("restarts"), workers=1, slots=8,
        heartbeat_seconds=0.5, lease_seconds=30.0,
    )  # fmt: skip
    with c:
        yield c


@pytest.fixture
def gate(tmp_path) -> Path:
    return tmp_path / "gate"


def gated(gate: Path) -> str:
    """A shell job: three lines, then it waits for ``gate``, then three more."""
    return (
        "for i in 1 2 3; do echo before $i; done; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        "for i in 1 2 3; do echo after $i; done"
    )


class Lines(threading.Thread):
    """Collects a subprocess's stdout lines as they come (and its stderr at the end)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.lines: list[str] = []
        self.stderr = ""
        self.start()

    def run(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        with self.proc.stdout, self.proc.stderr:
            for text in self.proc.stdout:
                self.lines.append(text.rstrip("\n"))
            self.stderr = self.proc.stderr.read()

    def finish(self) -> list[str]:
        """The lines, once the process exited 0."""
        code = self.proc.wait(JOIN_SECONDS)
        self.join(10)
        assert code == 0, self.stderr
        return self.lines


def cli(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GPULAYER_URL": cluster.url, "GPULAYER_TOKEN": cluster.admin_token,
           "GPULAYER_CONFIG": "/nonexistent/gpulayer.json"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "gpulayer", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def crash_and_restart(cluster: LocalCluster) -> None:
    cluster.restart_control_plane(signal.SIGKILL)


def out(lines: Iterable[contracts.LogLine]) -> list[str]:
    """The stdout lines (gpulayer's own system lines, like "started on", left out)."""
    return [ln.text for ln in lines if ln.stream == contracts.LogStream.stdout]


def stored(conn: gl.Connection, job_id: str) -> list[str]:
    return out(conn.logs(job_id).lines)


def test_job_waits_follows_and_the_cli_ride_through_a_restart(rcluster, gate):
    conn = rcluster.connection()
    job = gl.submit(gated(gate), connection=conn)
    follower = Waiter(lambda: out(gl.Job(conn, job.info).logs(follow=True)))
    waiter = Waiter(lambda: gl.Job(conn, job.info).wait().state)
    follower.start()
    waiter.start()
    logs_f = Lines(cli(rcluster, "logs", "-f", job.id))
    submitted = Lines(cli(rcluster, "submit", "--follow", "--shell", gated(gate)))
    until(lambda: logs_f.lines == BEFORE and submitted.lines == BEFORE, 60,
          "both CLI follows to print the first lines")  # fmt: skip

    crash_and_restart(rcluster)
    gate.touch()

    assert follower.answer() == BEFORE + AFTER
    assert waiter.answer() == contracts.JobState.succeeded
    assert logs_f.finish() == BEFORE + AFTER
    assert submitted.finish() == BEFORE + AFTER
    assert stored(conn, job.id) == BEFORE + AFTER  # and the control plane kept each once
    conn.close()


def slow(i: int, gate: str) -> int:
    print(f"item {i} before", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.05)
    print(f"item {i} after", flush=True)
    return i * 10


def test_function_calls_and_maps_ride_through_a_restart(rcluster, gate, tmp_path, capsys):
    conn = rcluster.connection()
    conn.health()
    fn = gl.remote(slow, connection=conn)
    runner = Waiter(lambda: fn.options(name="the-run").run(0, str(gate)))
    runner.start()
    spawned = fn.spawn(1, str(gate))
    result = Waiter(spawned.result)
    result.start()
    mapped = Waiter(lambda: list(fn.map([(i, str(gate)) for i in (2, 3, 4)], star=True,
                                        chunk_size=1, progress=False)))  # fmt: skip
    mapped.start()
    never = str(tmp_path / "never")
    to_cancel = fn.map([(5, never), (6, never)], star=True, chunk_size=1, progress=False)
    until(lambda: len([j for j in conn.jobs(state="running") if j.log_lines]) == 7, 60,
          "every call to run and print its first line")  # fmt: skip

    crash_and_restart(rcluster)
    to_cancel.close()  # cancelling still reaches the control plane after the restart
    gate.touch()

    assert runner.answer() == 0
    assert result.answer() == 10
    assert mapped.answer() == [20, 30, 40]
    assert capsys.readouterr().out.splitlines() == ["item 0 before", "item 0 after"]
    cancelled = until(
        lambda: all(conn.job(i).state == "cancelled" for i in to_cancel.job_ids), 60,
        "the closed map's calls to be cancelled",
    )  # fmt: skip
    assert cancelled and len(to_cancel.job_ids) == 2
    conn.close()


CELL = """print("cell before")
import os, time
while not os.path.exists({gate!r}):
    time.sleep(0.05)
print("cell after")
6 * 7"""


def follow_cell(run: cells.RemoteCell) -> tuple[str, list[str]]:
    text, values = "", []
    for msg in run.messages():
        if msg.msg_type == "stream":
            text += msg.content["text"]
        elif msg.msg_type == "execute_result":
            values.append(msg.content["data"]["text/plain"])
    run.result()
    return text, values


def test_cells_and_session_cells_ride_through_a_restart(rcluster, gate):
    conn = rcluster.connection()
    cells.ensure_session(conn, "restarts")
    source = CELL.format(gate=str(gate))
    plain = cells.submit(conn, source)
    in_session = cells.submit(conn, source, session="restarts")
    followers = [Waiter(lambda run=run: follow_cell(run)) for run in (plain, in_session)]
    for f in followers:
        f.start()
    until(lambda: all(conn.job(r.id).log_lines for r in (plain, in_session)), 90,
          "both cells to print their first line")  # fmt: skip

    crash_and_restart(rcluster)
    gate.touch()

    for f in followers:
        assert f.answer() == ("cell before\ncell after\n", ["42"])
    conn.end_session("restarts")
    conn.close()


def test_a_burst_of_submits_through_a_crash_stores_and_runs_each_job_once(rcluster, tmp_path):
    """The client retries the submits the crash cut off with their idempotency keys:
    every job it was told about exists once and ran once."""
    conn = rcluster.connection()
    conn.health()
    ran = tmp_path / "ran.txt"
    threads, each = 4, 25
    told: list[str] = []

    def burst(t: int) -> None:
        for i in range(each):
            name = f"burst-{t}-{i}"
            told.append(gl.submit(f"echo {name} >> {ran}", name=name, connection=conn).id)

    submitters = [Waiter(lambda t=t: burst(t)) for t in range(threads)]
    for s in submitters:
        s.start()
    until(lambda: len(told) >= 20, 60, "the burst to be under way")
    crash_and_restart(rcluster)
    for s in submitters:
        s.answer()

    assert len(set(told)) == threads * each
    jobs = [j for j in conn.jobs(limit=10000) if (j.spec.name or "").startswith("burst-")]
    assert sorted(j.id for j in jobs) == sorted(told)  # nothing stored that nobody was told of
    for job_id in told:
        assert conn.wait(job_id, timeout=JOIN_SECONDS).state == contracts.JobState.succeeded
    names = sorted(f"burst-{t}-{i}" for t in range(threads) for i in range(each))
    assert sorted(ran.read_text().split()) == names
    conn.close()


#: Longer than any wait below: a task that waited for its lease would fail the test.
LONG_LEASE_SECONDS = 600.0


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "dropped"])
@pytest.mark.parametrize("channel", ["auto", "http"], ids=["channel", "long-polls"])
def test_a_task_whose_answer_was_lost_runs_once_without_waiting_for_its_lease(
    fresh_cluster, tmp_path, crash, channel
):
    """The window behind the burst test's rare failure, held open: the control plane
    stores a task as started and answers its worker, the answer never arrives (a
    proxy drops it), and the connection drops (with the control plane killed, or
    alone). The worker, which had taken an answer before, opens its channel (or
    polls) again; the first answer there has a fresh seq, and the heartbeat that
    follows it does not list the task. So the task goes back to the queue and runs
    once, well within its lease, instead of ending lost or waiting for the lease
    (docs/adr/0136, 0150)."""
    c = fresh_cluster(workers=0, lease_seconds=LONG_LEASE_SECONDS)
    proxy = Proxy(c.port)
    proxy.start()
    url = c.url.replace(f":{c.port}/", f":{proxy.port}/")
    env = {**os.environ, "GPULAYER_JOIN_TOKEN": c.join_token, "GPULAYER_CHANNEL": channel}
    argv = [sys.executable, "-m", "gpulayer", "join", url, "--name", "far", "--slots", "2",
            "--data-dir", str(tmp_path / "far")]  # fmt: skip
    with (tmp_path / "far.log").open("wb") as log_file:
        worker = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    ran = tmp_path / "ran.txt"
    try:
        c.wait_for_workers(["far"])
        with c.connection() as conn:
            warm = gl.submit(f"echo warm >> {ran}", connection=conn)
            assert conn.wait(warm.id, timeout=JOIN_SECONDS).state == "succeeded"
            proxy.hold()
            job = gl.submit(f"echo first >> {ran}", name="unheard", connection=conn)
            until(lambda: conn.job(job.id).state == "running", 30,
                  "the control plane to store the task as started")  # fmt: skip
            proxy.cut()  # the answer is gone with the connection ...
            if crash:
                crash_and_restart(c)  # ... and with the control plane
            proxy.start()

            done = conn.wait(job.id, timeout=JOIN_SECONDS)  # far less than the lease
            assert done.state == "succeeded", attempts(done)
            assert sorted(ran.read_text().split()) == ["first", "warm"]  # each ran once
            # Its first task ended without running, and that attempt was not counted.
            assert [(t.state, t.attempt) for t in done.tasks] == [("lost", 1), ("succeeded", 1)]
            assert "never reached the worker" in (done.tasks[0].reason or "")
            assert done.attempts == 1
    finally:
        worker.terminate()
        worker.wait(30)
        proxy.cut()


@pytest.fixture
def tmp_path(gl_shared_dir: Path) -> Path:
    """Tasks here leave files for the test (pids, beats, ledgers, gates): a folder
    the task user can write (``gl_shared_dir``), not pytest's 0700 ``tmp_path``."""
    return gl_shared_dir
