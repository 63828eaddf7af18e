"""The first hour on a CPU-only machine, with the real thing: a job that can never run
says so at once and ends by its queue timeout, the control plane's log tells what
its services did, and `gpulayer up` / `status` / `down` work as a pair."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import submit
from gpulayer.cli import pidfile
from gpulayer.cli.cluster import free_port
from gpulayer.cluster import LocalCluster

from ..support import until
from .conftest import FAST, kernel_env, notebook, outputs, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def laptop(tmp_path_factory) -> Iterator[LocalCluster]:
    """A control plane and one worker without GPUs, like `gpulayer up` on a laptop."""
    with LocalCluster(tmp_path_factory.mktemp("laptop"), workers=1, **FAST) as c:
        yield c


def gpulayer(*argv: str, env: dict[str, str] | None = None, timeout: float = 90):
    """Run the `gpulayer` command as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "gpulayer", *argv],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def as_user(cluster: LocalCluster, tmp_path: Path) -> dict[str, str]:
    return {"GPULAYER_URL": cluster.url, "GPULAYER_TOKEN": cluster.admin_token,
            "GPULAYER_CONFIG": str(tmp_path / "absent.json")}  # fmt: skip


def test_an_impossible_job_warns_at_once_and_ends_by_its_queue_timeout(
    laptop: LocalCluster, tmp_path: Path
) -> None:
    env = as_user(laptop, tmp_path)
    out = gpulayer("submit", "--gpus", "1", "--", "python", "-c", "print('hi')", env=env)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    assert out.stderr.startswith(f"gpulayer: warning: job {job_id} cannot start: unsatisfiable")
    assert "local-1: needs 1 × GPU, has no GPUs" in out.stderr
    assert "gpulayer up --simulated-gpus" in out.stderr
    gpulayer("cancel", job_id, env=env)

    started = time.monotonic()
    out = gpulayer("submit", "-f", "--gpus", "1", "--queue-timeout", "3s",
                   "--", "python", "-c", "print('hi')", env=env)  # fmt: skip
    took = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert lines[1].split(" cannot start: ")[1].startswith("unsatisfiable")
    assert lines[-1].endswith(
        "timed_out: still queued after 3.0s: unsatisfiable: no registered worker could ever"
        " run this job; local-1: needs 1 × GPU, has no GPUs"
    ), lines
    assert took < 60  # not the silent wait of issue 22


def test_the_control_plane_log_tells_what_its_services_did(laptop: LocalCluster) -> None:
    with laptop.connection() as conn:
        job = submit(["python", "-c", "import time; print('up', flush=True); time.sleep(60)"],
                     connection=conn)  # fmt: skip
        until(lambda: job.refresh().state == "running", 60, "the job to run")
        job.cancel().wait(timeout=60)
    log = laptop.log_path()
    wanted = ("jupyter_ext.workers] worker local-1 (", f"job {job.id}: cancel requested",
              "jupyter_ext.tasks] task ")  # fmt: skip
    until(lambda: all(w in log.read_text() for w in wanted), 30, "the services' lines")
    text = log.read_text()
    assert " registered" in text and " cancelled" in text


def test_up_status_and_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"GPULAYER_CONFIG": str(tmp_path / "connection.json"),
           "GPULAYER_DATA_DIR": str(data)}  # fmt: skip
    port = free_port()
    with (tmp_path / "up.log").open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "up", "--port", str(port)],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        until(lambda: pidfile.running(data) is not None or up.poll() is not None, 90, "up")
        assert up.poll() is None, (tmp_path / "up.log").read_text()
        status = gpulayer("status", env=env)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("gpulayer ") and " is up at http://" in status.stdout
        again = gpulayer("up", "--port", str(free_port()), env=env)
        assert again.returncode == 1 and "already running" in again.stderr

        down = gpulayer("down", env=env)
        assert down.returncode == 0, down.stderr
        assert up.poll() is not None  # down returns once it is gone
        assert not (data / pidfile.FILENAME).exists()
        assert gpulayer("status", env=env).returncode == 1
        assert gpulayer("down", env=env).returncode == 1
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(60)


def test_jobs_into_a_reader_that_left_exits_0_quietly(laptop: LocalCluster, tmp_path: Path) -> None:
    """`gpulayer jobs | head -2`: the reader is gone before the table is written."""
    with laptop.connection() as conn:
        submit(["true"], connection=conn).wait(timeout=60)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "jobs"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **as_user(laptop, tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(60) == 0
    assert err == b""


def test_a_cell_no_worker_can_run_says_why_at_once_and_ends_by_its_queue_timeout(
    laptop: LocalCluster, tmp_path: Path
) -> None:
    nb = notebook("%load_ext gpulayer",
                  "%%gpulayer --gpus 4 --queue-timeout 5s\nprint('never')")  # fmt: skip
    cell = run(nb, kernel_env(laptop, tmp_path)).cells[1]
    said = "".join(o.text for o in outputs(cell, "stream") if o.name == "stderr")
    assert said.startswith("[gpulayer] job ") and " cannot start: unsatisfiable" in said, said
    assert "local-1: needs 4 × GPU, has no GPUs" in said
    (error,) = outputs(cell, "error")
    assert error.ename == "JobFailed"
    assert "timed_out: still queued after 5.0s: unsatisfiable" in error.evalue
