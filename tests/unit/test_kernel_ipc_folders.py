"""The JupyterLab-side provisioner's socket folders (``gpulayer/kernel_provisioner.py``):
a Jupyter server killed before its kernels' cleanup leaves its ``glk-PID-*`` folder,
and the next kernel this user starts removes it, never a live process's."""

import os
import subprocess
import sys

from gpulayer import kernel_provisioner


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_servers_folder_goes_and_the_rest_stay(tmp_path):
    dead = tmp_path / f"glk-{_dead_pid()}-abc123"
    (dead / "inner").mkdir(parents=True)
    (dead / "inner" / "kernel-1").write_text("")
    live = tmp_path / f"glk-{os.getpid()}-def456"  # this process: alive
    live.mkdir()
    worker_kind = tmp_path / "glk-x1y2z3"  # a worker's kernel folder: not named by pid
    worker_kind.mkdir()
    other = tmp_path / "unrelated"
    other.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / f"glk-{_dead_pid()}-link00"  # a link in its place is not followed
    link.symlink_to(target)

    removed = kernel_provisioner.remove_orphaned_ipc_folders(str(tmp_path))

    assert removed == [dead.name]
    assert not dead.exists()
    assert live.is_dir() and worker_kind.is_dir() and other.is_dir()
    assert (target / "keep").read_text() == "x"


def test_a_new_folder_is_private_and_named_after_its_maker(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_provisioner.tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"glk-{_dead_pid()}-zz9"
    stale.mkdir()
    made = kernel_provisioner._ipc_folder()
    assert os.path.basename(made).startswith(f"glk-{os.getpid()}-")
    assert os.stat(made).st_mode & 0o777 == 0o700
    assert not stale.exists()
