"""Command jobs end to end: real control plane, real workers, real processes."""

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

import gpulayer.client as gl
from gpulayer import cli
from gpulayer.errors import InvalidTransition, JobFailed, ValidationError

from ..support import until

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_output_arrives_in_order_without_gaps_or_duplicates(conn):
    n = 3000
    job = gl.submit([PY, "-c", f"for i in range({n}): print('line', i)"], connection=conn)
    followed = list(job.logs(follow=True))
    assert [ln.text for ln in followed if ln.stream == "stdout"] == [f"line {i}" for i in range(n)]
    assert [ln.offset for ln in followed] == list(range(len(followed)))
    job.wait(timeout=30)
    assert job.state == "succeeded" and job.exit_code == 0
    # Reading again from an offset gives the tail, not everything.
    page = conn.logs(job.id, offset=len(followed) - 5)
    assert len(page.lines) == 5 and page.complete


def test_failing_command_reports_exit_code_and_stderr(conn):
    job = gl.submit(
        [PY, "-c", "import sys; print('bad input', file=sys.stderr); sys.exit(3)"], connection=conn
    )
    job.wait(timeout=30)
    assert (job.state, job.exit_code) == ("failed", 3)
    assert job.info.reason == "exit code 3"
    assert ("stderr", "bad input") in [(ln.stream, ln.text) for ln in job.logs(follow=True)]
    with pytest.raises(JobFailed, match="exit code 3"):
        job.wait(raise_on_failure=True)


def test_a_missing_executable_fails_with_a_clear_reason(conn):
    job = gl.submit(["no-such-program-xyz"], connection=conn).wait(timeout=30)
    assert job.state == "failed"
    assert "no-such-program-xyz" in job.info.reason


def test_shell_env_and_gpu_reservation_reach_the_process(conn):
    job = gl.submit(
        "echo $GREETING from gpus=$CUDA_VISIBLE_DEVICES",
        env={"GREETING": "hello"},
        gpus=2,
        connection=conn,
    ).wait(timeout=30)
    assert job.state == "succeeded"
    assert "hello from gpus=0,1" in job.logs()


def test_cancel_stops_the_whole_process_tree(conn, gl_shared_dir):
    pids = gl_shared_dir / "pids"
    script = f"sleep 120 & echo $$ $! > {pids}; echo started; wait"
    job = gl.submit(["/bin/sh", "-c", script], connection=conn)
    until(lambda: pids.exists() and pids.read_text().strip(), what="the job to start")
    tree = [int(p) for p in pids.read_text().split()]
    assert all(alive(p) for p in tree)
    job.cancel()
    job.wait(timeout=30)
    assert job.state == "cancelled"
    until(lambda: not any(alive(p) for p in tree), timeout=10, what="the tree to be gone")
    with pytest.raises(InvalidTransition, match="already cancelled"):
        job.cancel()


def test_timeout_ends_the_job_timed_out(conn):
    job = gl.submit(
        [PY, "-c", "import time; print('waiting'); time.sleep(60)"], timeout="1s", connection=conn
    ).wait(timeout=30)
    assert job.state == "timed_out"
    assert "timed out after 1.0s" in job.info.reason
    assert job.info.duration < 15


def test_workdir_bundle_and_artifacts_round_trip(conn, tmp_path):
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "data.txt").write_text("3 4 5\n")
    (src / "main.py").write_text(
        "import json, os, pathlib\n"
        "nums = [int(x) for x in open('pkg/data.txt').read().split()]\n"
        "out = pathlib.Path(os.environ['GPULAYER_ARTIFACTS'])\n"
        "(out / 'plots').mkdir()\n"
        "(out / 'plots' / 'sum.json').write_text(json.dumps({'sum': sum(nums)}))\n"
        "(out / 'blob.bin').write_bytes(bytes(range(256)) * 4000)\n"
        "print('done')\n"
    )
    job = gl.submit([PY, "main.py"], workdir=src, connection=conn).wait(timeout=30)
    assert job.state == "succeeded", job.logs()
    assert {a.name: a.size for a in job.artifacts} == {"blob.bin": 1024000, "plots/sum.json": 11}
    paths = job.download(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "plots" / "sum.json").read_text()) == {"sum": 12}
    assert (tmp_path / "out" / "blob.bin").read_bytes() == bytes(range(256)) * 4000
    assert len(paths) == 2


def test_two_jobs_on_a_one_slot_worker_run_one_after_the_other(fresh_cluster):
    c = fresh_cluster(workers=1, slots=1)
    with c.connection() as conn:
        first = gl.submit(
            [PY, "-c", "import time; time.sleep(0.5); print('first')"], connection=conn
        )
        second = gl.submit([PY, "-c", "print('second')"], connection=conn)
        queued = conn.job(second.id)
        assert queued.state == "queued"
        assert queued.pending_reasons == ["local-1: its only task slot is busy"]
        first.wait(timeout=30)
        second.wait(timeout=30)
        assert first.state == second.state == "succeeded"
        assert second.info.started_at >= first.info.ended_at


def test_bad_input_is_refused_before_anything_is_stored(conn):
    before = len(conn.jobs(limit=10000))
    with pytest.raises(ValidationError, match=r"resources\.gpus"):
        gl.submit(["true"], gpus=-1, connection=conn)
    with pytest.raises(ValidationError, match="timeout"):
        gl.submit(["true"], timeout="forever", connection=conn)
    assert len(conn.jobs(limit=10000)) == before


def test_history_survives_a_control_plane_restart_and_running_jobs_finish(
    fresh_cluster, gl_shared_dir
):
    # A restart shorter than lease - 2 x heartbeat (here 9 s) keeps running tasks; a
    # longer outage stops them (docs/adr/0082-fencing.md).
    c = fresh_cluster(workers=1, lease_seconds=10.0)
    with c.connection() as conn:
        done = gl.submit([PY, "-c", "print('before restart')"], connection=conn).wait(timeout=30)
        marker = gl_shared_dir / "go"
        running = gl.submit(
            [
                PY,
                "-c",
                "import os, time\n"
                "print('one', flush=True)\n"
                f"while not os.path.exists({str(marker)!r}): time.sleep(0.05)\n"
                "print('two')",
            ],
            connection=conn,
        )
        until(lambda: "one" in running.logs(), what="the first line")
    c.restart_control_plane()
    marker.write_text("go")
    with c.connection() as conn:
        again = conn.job(done.id)
        assert again.state == "succeeded" and again.ended_at == done.info.ended_at
        assert [ln.text for ln in conn.logs(done.id).lines][-1] == "before restart"
        job = gl.Job(conn, conn.job(running.id)).wait(timeout=30)
        assert job.state == "succeeded"
        texts = [ln.text for ln in job.logs(follow=True) if ln.stream == "stdout"]
        assert texts == ["one", "two"]
        assert [w.state for w in conn.workers()] == ["ready"]


def test_a_killed_worker_loses_its_task_and_a_retry_runs_elsewhere(fresh_cluster):
    c = fresh_cluster(workers=1, slots=1)
    with c.connection() as conn:
        job = gl.submit(
            [
                PY,
                "-c",
                "import time, os; print(os.environ['GPULAYER_ATTEMPT'],"
                " flush=True); time.sleep(1 if os.environ['GPULAYER_ATTEMPT'] == '2'"
                " else 60)",
            ],
            retries=1,
            connection=conn,
        )
        until(lambda: job.logs(), what="the first attempt to start")
        c.stop_worker("local-1", signal.SIGKILL)
        c.add_worker("local-2", slots=1)
        job.wait(timeout=60)
        assert job.state == "succeeded"
        attempts = [(t.attempt, t.state, t.worker_name) for t in conn.job(job.id).tasks]
        assert attempts == [(1, "lost", "local-1"), (2, "succeeded", "local-2")]


def test_worker_sigterm_releases_its_task_for_a_retry_and_exits_cleanly(
    fresh_cluster, gl_shared_dir
):
    c = fresh_cluster(workers=1)
    pidfile = gl_shared_dir / "pid"
    with c.connection() as conn:
        job = gl.submit(
            ["/bin/sh", "-c", f"echo $$ > {pidfile}; exec sleep 120"], retries=1, connection=conn
        )
        until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="start")
        pid = int(pidfile.read_text())
        assert c.stop_worker("local-1", signal.SIGTERM) == 0
        assert not alive(pid)
        until(lambda: conn.job(job.id).state == "queued", what="the job to be queued again")
        first = conn.job(job.id).tasks[0]
        assert (first.state, first.reason) == ("lost", "worker shutting down")
        pidfile.unlink()
        c.add_worker("local-2")
        until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the retry")
        assert conn.job(job.id).tasks[-1].worker_name == "local-2"
        job.cancel()
        assert job.wait(timeout=30).state == "cancelled"


def test_cli_submit_follow_prints_output_live_and_exits_with_the_code(cluster):
    env = {**os.environ, "GPULAYER_URL": cluster.url, "GPULAYER_TOKEN": cluster.admin_token}
    out = subprocess.run(
        [
            PY,
            "-m",
            "gpulayer",
            "submit",
            "--follow",
            "--",
            PY,
            "-c",
            "print('hi'); raise SystemExit(4)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.stdout.splitlines() == ["hi"]
    assert out.returncode == 4
    assert "failed" in out.stderr
    workers = subprocess.run(
        [PY, "-m", "gpulayer", "workers"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "local-1" in workers.stdout and "ready" in workers.stdout
    bad = subprocess.run(
        [PY, "-m", "gpulayer", "job", "nope"], capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "gpulayer: error: no job with id 'nope'"


def test_the_cli_strips_terminal_escapes_from_job_output_unless_raw(cluster, conn, capsys):
    evil = r"print('\x1b]0;pwned\x07\x1b[31mred\x1b[0m\x1b[2K'); print('\x9b2Jdone\r')"
    job = gl.submit([PY, "-c", evil], connection=conn).wait(timeout=30)
    assert job.state == "succeeded"
    base = ["--url", cluster.url, "--token", cluster.admin_token]
    assert cli.main(["logs", job.id, *base]) == 0
    assert capsys.readouterr().out == "red\ndone\n"
    assert cli.main(["logs", job.id, "--raw", *base]) == 0
    assert capsys.readouterr().out == "\x1b]0;pwned\x07\x1b[31mred\x1b[0m\x1b[2K\n\x9b2Jdone\r\n"
    assert cli.main(["submit", "-f", *base, "--", PY, "-c", evil]) == 0
    assert capsys.readouterr().out == "red\ndone\n"
