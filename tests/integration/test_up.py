"""`gpulayer up` as a person starts it, in a terminal: start-up progress, the one
default data dir, and an older gpulayer's data moved into it."""

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import httpx
import psutil
import pytest

import gpulayer as gl
from gpulayer import contracts
from gpulayer.cli.cluster import LocalCluster
from gpulayer.cli.processes import free_port
from gpulayer.errors import GpulayerError

from ..support import fake_pydantic_plugin
from .conftest import FAST


def read_until(fd: int, marker: str, timeout: float) -> str:
    """What the terminal shows until ``marker`` appears (or the deadline, or EOF)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker.encode() not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


def test_up_in_a_terminal_shows_start_up_and_moves_old_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    legacy = home / ".local" / "share" / "gpulayer"
    legacy.mkdir(parents=True)
    (legacy / "notes.txt").write_text("kept from an older gpulayer\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPULAYER_", "XDG_", "JUPYTER_"))}  # fmt: skip
    env.update(HOME=str(home), GPULAYER_CONFIG=str(tmp_path / "connection.json"))
    primary, secondary = pty.openpty()
    # A terminal 120 columns wide (a new pty has no size, and tqdm would draw nothing).
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "up", "--port", str(free_port()),
         "--local-workers", "1", "--no-save-config"],
        stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary, env=env, close_fds=True,
    )  # fmt: skip
    os.close(secondary)
    try:
        shown = read_until(primary, "gpulayer is up", timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(primary)
    data = home / ".local" / "share" / "jupyter" / "gpulayer"
    assert "gpulayer is up" in shown, shown
    assert f"moved the gpulayer data from {legacy} to {data}" in shown
    assert "starting gpulayer: 0/2" in shown  # drawn at once, before anything is ready
    assert "control plane ready, waiting for workers" in shown
    # The one default data dir holds the old data and the new control plane's files.
    assert (data / "notes.txt").read_text() == "kept from an older gpulayer\n"
    assert (data / "admin.token").is_file() and (data / "gpulayer.db").is_file()
    assert legacy.is_symlink() and (data.stat().st_mode & 0o777) == 0o700


def test_a_second_control_plane_on_the_same_data_dir_stops_at_once(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, workers=0, **FAST):
        second = LocalCluster(tmp_path, workers=0, **FAST)
        started = time.monotonic()
        with pytest.raises(GpulayerError, match="another gpulayer control plane") as info:
            second.start()
        assert time.monotonic() - started < 50  # not the 60 s start-up deadline
        assert "--data-dir" in str(info.value)


def test_a_control_plane_whose_port_another_one_holds_fails_with_its_reason(
    tmp_path: Path,
) -> None:
    """The other server answers health on that port, but it is not this cluster's:
    the start waits for its own control plane, which cannot bind, and says why
    (instead of going on with the other one, or blaming unreadable tokens)."""
    with LocalCluster(tmp_path / "a", workers=0) as first:
        second = LocalCluster(tmp_path / "b", workers=1, port=first.port)
        with pytest.raises(GpulayerError) as info:
            second.start()
        assert "control plane exited" in str(info.value)
        assert f"port {first.port} is not available" in str(info.value)
        assert second.workers == [] and second.server_pid is None  # nothing left running
        with first.connection() as conn:
            assert conn.workers() == []  # no worker of the second joined the first


def test_on_a_new_data_dir_workers_start_beside_the_control_plane(tmp_path: Path) -> None:
    """The local worker starts while the control plane does and gets its join token
    on stdin, not in its arguments or environment; on the data dir's next starts
    (a database exists) the workers start after the control plane, as before, and
    come back whether the port is the same or another one (a credential goes back
    only to the URL that issued it: the old registration is forgotten)."""
    port = free_port()
    for start in ("new", "same port", "another port"):
        at = {"port": port} if start != "another port" else {}
        with LocalCluster(tmp_path, workers=1, **at, **FAST) as cluster:
            with cluster.connection() as conn:
                assert [w.name for w in conn.workers() if w.state == "ready"] == ["local-1"]
                # Ready means this start's worker: it runs work at once.
                job = conn.submit(contracts.JobSpec(command=["true"]))
                assert conn.wait(job.id, timeout=30).state == "succeeded", start
            if start == "new":
                pid = cluster.worker_pid("local-1")
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                assert b"--token-file\0-" in argv
                assert cluster.join_token.encode() not in argv + environ
                # What a fresh start makes is private already: no warning to read.
                assert "readable by others" not in cluster.log_path().read_text()


def test_a_worker_started_early_prepares_while_it_waits_for_its_token(tmp_path: Path) -> None:
    """A worker that `gpulayer up` starts beside its control plane starts its warm
    runner before the join token arrives (the control plane is still starting), and
    a stop while it waits (the control plane failed) ends it cleanly: exit 0, its
    runner gone, its tasks folder removed."""
    argv = [sys.executable, "-m", "gpulayer", "join", f"http://127.0.0.1:{free_port()}/",
            "--name", "early", "--token-file", "-", "--task-user", "",
            "--data-dir", str(tmp_path / "w")]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        me = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        runners: list[psutil.Process] = []
        while not runners and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            runners = [p for p in me.children(recursive=True)
                       if "gpulayer.worker.runner" in " ".join(p.cmdline())]  # fmt: skip
        assert runners, "no warm runner started before the token"
        folders = list(Path(tempfile.gettempdir()).glob("gpulayer-tasks-early-*"))
        assert folders
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # stdin stays open: the token never comes
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert b"Fatal Python error" not in err
    psutil.wait_procs(runners, timeout=10)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in runners)
    assert not any(f.exists() for f in folders)


def test_the_control_plane_collects_garbage_once_it_is_up(tmp_path: Path) -> None:
    """`python -m jupyter_ext` starts without the garbage collector and turns it
    back on once ready: its metrics count the collector's passes going on."""

    def passes() -> float:
        text = httpx.get(cluster.url + "gpulayer/metrics", headers=auth, timeout=30).text
        line = next(s for s in text.splitlines()
                    if s.startswith('python_gc_collections_total{generation="0"}'))  # fmt: skip
        return float(line.split()[1])

    with LocalCluster(tmp_path, workers=0, **FAST) as cluster:
        auth = {"Authorization": f"Bearer {cluster.admin_token}"}
        first = passes()
        deadline = time.monotonic() + 30
        # Every scrape allocates: the youngest generation fills up, again and again.
        while (now := passes()) == first and time.monotonic() < deadline:
            pass
    assert now > first


def test_the_control_plane_and_workers_load_no_pydantic_plugin(tmp_path: Path) -> None:
    """A pydantic plugin installed beside gpulayer (an entry point) is not looked
    for by the headless control plane or a worker (ADR 0148), through a whole call;
    nor by the workers `gpulayer up` forks from its fork server (ADR 0151)."""
    site = tmp_path / "site"
    site.mkdir()
    env = fake_pydantic_plugin(site)
    with LocalCluster(tmp_path / "data", workers=2, env={"PYTHONPATH": env["PYTHONPATH"]},
                      **FAST) as cluster, cluster.connection() as conn:  # fmt: skip
        f = gl.remote(lambda x: x + 1, connection=conn)
        assert [f.run(1), f.run(2)] == [2, 3]
        logs = [cluster.log_path(), *(cluster.log_path(w) for w in cluster.workers)]
        logs.append(cluster.log_dir / "forkserver.log")  # where the workers imported
        assert all(path.exists() for path in logs)
        assert not any("plugin loaded" in path.read_text() for path in logs)
