"""The task supervisor (``python -m gpulayer.worker.supervisor``) as a real process: it
kills marked processes and registered process groups when its pipe closes, when the
lease it was given runs out, or when asked; and nothing else."""

import contextlib
import os
import subprocess
import sys
import time

import psutil
import pytest

from gpulayer.worker import spawning

from ..support import until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def supervisor():
    """A supervisor for fence ``test-<pid>`` on a pipe; yields ``(write_fd, proc, mark)``."""
    fence = f"test{os.getpid()}"
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer.worker.supervisor", fence, str(os.getpid())],
        stdin=r,
        start_new_session=True,
    )
    os.close(r)
    started: list[subprocess.Popen] = []
    yield w, proc, {spawning.FENCE_ENV: fence}, started
    for p in started:
        p.kill()
        p.wait()
    with contextlib.suppress(OSError):  # a test closed it already
        os.close(w)
    proc.wait(10)


def start(started, env=None, **kw) -> subprocess.Popen:
    p = subprocess.Popen(SLEEP, env={**os.environ, **(env or {})}, **kw)
    started.append(p)
    return p


def test_closing_the_pipe_kills_marked_processes_and_registered_groups_only(supervisor):
    w, proc, mark, started = supervisor
    marked = start(started, mark)
    group = start(started, start_new_session=True)
    bystander = start(started)
    os.write(w, b"pid %d\n" % group.pid)
    os.close(w)
    assert proc.wait(10) == 0  # it exits once the tasks are gone
    marked.wait(5)
    group.wait(5)
    assert marked.returncode == group.returncode == -9
    assert alive(bystander.pid)


def test_a_lease_that_runs_out_unrenewed_kills_the_tasks_and_a_renewed_one_does_not(supervisor):
    w, proc, mark, started = supervisor
    task = start(started, mark)
    os.write(w, b"until %.3f\n" % (time.monotonic() + 0.5))
    os.write(w, b"until %.3f\n" % (time.monotonic() + 60))  # renewed: holds
    time.sleep(1.0)
    assert alive(task.pid)
    began = time.monotonic()
    os.write(w, b"until %.3f\n" % (began + 0.3))
    task.wait(10)
    assert task.returncode == -9 and time.monotonic() - began >= 0.3
    assert proc.poll() is None  # it stays, for the agent's next tasks
    time.sleep(0.5)  # past its kill loop, which also takes forks racing it
    later = start(started, mark)
    time.sleep(0.5)
    assert alive(later.pid)  # a lapsed lease kills once, not every task from then on
    os.write(w, b"stop\n")
    until(lambda: not alive(later.pid), timeout=10, what="stop to kill the task")


def test_child_options_make_a_child_die_with_its_parent(tmp_path):
    if spawning.die_with_parent() is None:
        pytest.skip("no parent-death signal here")
    pidfile = tmp_path / "pid"
    parent = (
        "import subprocess, sys, time\n"
        "from gpulayer.worker.spawning import child_options\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " **child_options())\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        child = int(until(lambda: pidfile.exists() and pidfile.read_text(), what="the child"))
        assert os.getpgid(child) == child  # its own session and group
        proc.kill()
        until(lambda: not alive(child), timeout=5, what="the child to die with its parent")
    finally:
        proc.kill()
        proc.wait()


def test_the_agents_folders_are_removed_once_it_is_gone_and_not_before(supervisor, tmp_path):
    w, proc, mark, started = supervisor
    folders = [tmp_path / "tasks-root", tmp_path / "glk-x"]
    for folder in folders:
        (folder / "task" / "work").mkdir(parents=True)
        (folder / "task" / "work" / "checkpoint.pt").write_bytes(b"x" * 1000)
        os.write(w, f"clean {folder}\n".encode())
    os.write(w, b"clean relative/path\n")  # not an absolute path: ignored
    kept = tmp_path / "not-named"
    kept.mkdir()
    # A folder the agent removed itself, whose name someone else took since: not ours.
    reused = tmp_path / "glk-reused"
    reused.mkdir()
    os.write(w, f"clean {reused}\nforget {reused}\n".encode())
    marked = start(started, mark)
    os.write(w, b"stop\n")  # kills the tasks; the agent lives on: its folders stay
    until(lambda: not alive(marked.pid), 10, "the marked task killed")
    assert all(folder.is_dir() for folder in folders)
    os.close(w)  # the agent is gone
    proc.wait(10)
    assert not any(folder.exists() for folder in folders)
    assert kept.is_dir() and reused.is_dir()
