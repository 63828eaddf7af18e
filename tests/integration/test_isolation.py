"""Tenants' tasks against the control plane and each other, on a real cluster.

As root (CI, this sandbox) a worker runs its tasks as the unprivileged user
``gpulayer-task``: a job cannot read ``admin.token``, ``join.token``, the database
or Jupyter's server files, by relative or absolute path, nor another local user's
task folder. Whoever the tasks run as, the data dir is owner-only throughout
(whatever the umask), a function runner never unpickles into the worker, and a
runner that one owner's function changed never serves another owner.
"""

import json
import os
import pwd
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from jupyter_core.paths import jupyter_runtime_dir

import gpulayer as gl
from gpulayer import contracts, errors
from gpulayer.cli.processes import free_port
from gpulayer.client import Connection
from gpulayer.cluster import LocalCluster

from ..support import until

PY = sys.executable
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="tasks change user only under root")

PROBE = textwrap.dedent(
    """
    import glob, json, os, sys
    data = sys.argv[1]
    targets = [os.path.join(data, f) for f in ("admin.token", "join.token", "gpulayer.db")]
    targets += [os.path.relpath(t, os.getcwd()) for t in targets]  # ../../../…/admin.token
    targets += glob.glob(os.path.join(sys.argv[2], "jpserver-*.json")) + [sys.argv[2]]
    read = []
    for t in targets:
        try:
            if os.path.isdir(t):
                os.listdir(t)
            else:
                open(t, "rb").read(1)
            read.append(t)
        except OSError:
            pass
    print(json.dumps({"uid": os.getuid(), "home": os.environ["HOME"], "read": read}))
    """
)


def _probe(conn: Connection, cluster: LocalCluster) -> dict:
    runtime = jupyter_runtime_dir()  # the control plane's: it runs with this environment
    job = gl.submit([PY, "-c", PROBE, str(cluster.data_dir), runtime], connection=conn)
    job.wait(timeout=60)
    assert job.state == "succeeded", job.logs()
    return json.loads(job.logs()[-1])


@ROOT_ONLY
def test_a_job_of_a_root_worker_runs_unprivileged_and_cannot_read_the_control_plane(cluster, conn):
    seen = _probe(conn, cluster)
    assert seen["uid"] == pwd.getpwnam("gpulayer-task").pw_uid != 0
    assert seen["read"] == []
    assert not seen["home"].startswith(str(cluster.data_dir))  # a HOME of its own, outside


def _folder_and_home() -> tuple[list[str], str, bool]:
    """What a task sees: its folder's entries, its HOME, and whether HOME is writable."""
    folder = Path.cwd().parent
    home = os.environ["HOME"]
    Path(home, "probe").write_text("x")
    return sorted(os.listdir(folder)), home, os.access(home, os.W_OK)


@ROOT_ONLY
def test_a_call_uses_its_runners_home_and_a_command_gets_one_in_its_folder(cluster, conn):
    entries, home, writable = gl.remote(_folder_and_home, connection=conn).run()
    # A call's folder holds only its cwd and artifacts: the warm runner has its HOME.
    assert entries == ["artifacts", "work"]
    assert writable and Path(home).parent.name.startswith("runner-"), home
    probe = "import os,sys; print(sorted(os.listdir('..')), os.environ['HOME'])"
    job = gl.submit([PY, "-c", probe], connection=conn)
    job.wait(timeout=60)
    assert job.state == "succeeded", job.logs()
    line = job.logs()[-1]
    assert line.startswith("['artifacts', 'home', 'tmp', 'work'] "), line
    assert line.split()[-1].endswith("/home")


@ROOT_ONLY
def test_a_task_cannot_read_another_local_users_task_folder(cluster, conn, fresh_cluster):
    other = fresh_cluster(workers=1, task_user="nobody")  # another user's worker and tasks
    with other.connection() as oconn:
        victim = gl.submit(
            ["/bin/sh", "-c", "echo secret > mine.txt; id -u; pwd; exec sleep 120"],
            connection=oconn,
        )
        until(lambda: len(victim.logs()) >= 3, 60, "the other user's task")
        uid, folder = victim.logs()[-2:]
        assert int(uid) == pwd.getpwnam("nobody").pw_uid
        thief = gl.submit(
            ["/bin/sh", "-c", f"cat {folder}/mine.txt || ls {folder} || echo denied"],
            connection=conn,
        ).wait(timeout=60)
        assert thief.logs()[-1] == "denied" and "secret" not in thief.logs()
        victim.cancel()


def test_every_file_of_the_data_dir_is_owner_only_whatever_the_umask(tmp_path, gl_shared_dir):
    src = tmp_path / "src"  # a bundle: the worker keeps it in its own data dir
    src.mkdir()
    (src / "data.txt").write_text("out\n")
    old = os.umask(0o022)
    try:
        with LocalCluster(tmp_path / "data", tls=True) as c, c.connection() as conn:
            job = gl.submit(
                ["/bin/sh", "-c", "cp data.txt $GPULAYER_ARTIFACTS/a.txt"],
                workdir=src,
                connection=conn,
            )
            assert job.wait(timeout=60).state == "succeeded"
            config = gl_shared_dir / "cfg" / "connection.json"
            from gpulayer.client import config as client_config

            client_config.save(client_config.ConnectionConfig(url=c.url, token="x"), config)
            loose = [
                f"{stat.filemode(p.lstat().st_mode)} {p}"
                for p in [c.data_dir, *c.data_dir.rglob("*"), config, config.parent]
                if p.lstat().st_mode & 0o077
            ]
    finally:
        os.umask(old)
    assert loose == []
    for name in ("gpulayer.db", "admin.token", "join.token", "tls/key.pem", "logs", "blobs",
                 "workers/local-1/blobs"):  # fmt: skip
        assert (c.data_dir / name).exists(), name  # the walk saw the real thing


def test_an_older_data_dir_made_readable_is_tightened_at_start(tmp_path):
    """The folder is its owner's alone as soon as the control plane is up; what lies
    inside is tightened right after (a walk that does not delay readiness), and the
    log says how many entries were fixed."""
    data = tmp_path / "data"
    with LocalCluster(data, workers=0):
        pass
    for p in [data, *data.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    with LocalCluster(data, workers=0) as cluster:
        assert data.stat().st_mode & 0o077 == 0
        deadline = time.monotonic() + 30
        while "were readable by others" not in cluster.log_path().read_text():
            assert time.monotonic() < deadline, cluster.log_path().read_text()
            time.sleep(0.05)
        loose = [p for p in [data, *data.rglob("*")] if p.lstat().st_mode & 0o077]
    assert loose == []


def test_a_runner_that_sends_a_pickle_is_killed_not_believed(conn, gl_shared_dir):
    marker = gl_shared_dir / "unpickled"

    def forge(path):
        import gc
        import pickle

        class Boom:
            def __reduce__(self):
                return (open, (path, "w"))  # would create the file in the worker

        [channel] = [o for o in gc.get_objects() if type(o).__name__ == "Channel"]
        data = pickle.dumps(("done", "x", Boom(), None))
        channel._w.write(len(data).to_bytes(8, "big") + data)
        channel._w.flush()
        import time

        time.sleep(30)

    with pytest.raises(errors.JobFailed) as info:
        gl.remote(forge, connection=conn).run(str(marker))
    assert "not the runner protocol" in (info.value.reason or "")
    assert not marker.exists()


def test_a_function_that_patches_its_runner_never_touches_another_owners_calls(cluster, conn):
    tokens = {}
    for name in ("ada", "bob"):
        req = contracts.CreateToken(name=name, role="submitter")
        tokens[name] = conn.create_token(req).token

    def patch():
        import string

        string.capwords = lambda *a, **k: "patched"
        return os.getpid()

    def capwords():
        import string

        return string.capwords("hello world"), os.getpid()

    with (
        Connection(cluster.url, tokens["ada"]) as ada,
        Connection(cluster.url, tokens["bob"]) as bob,
    ):
        ada_pid = gl.remote(patch, connection=ada).run()
        assert gl.remote(capwords, connection=ada).run() == ("patched", ada_pid)  # its runner
        text, bob_pid = gl.remote(capwords, connection=bob).run()
    assert text == "Hello World" and bob_pid != ada_pid


@ROOT_ONLY
def test_join_says_in_one_line_when_the_task_user_cannot_run_this_python(tmp_path):
    # This test's venv, in a folder only root may enter (as a venv under /root would be).
    venv = tmp_path / "private" / "venv"
    base = Path(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(base)
    (venv / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\n"
    )
    lib = venv / "lib" / base.name
    lib.mkdir(parents=True)
    (lib / "site-packages").symlink_to(next(p for p in sys.path if p.endswith("site-packages")))
    tmp_path.chmod(0o700)
    env = {**os.environ, "GPULAYER_JOIN_TOKEN": "gl_x"}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "gpulayer", "join", "http://127.0.0.1:9/",
         "--data-dir", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("gpulayer: error: tasks run as the unprivileged user gpulayer-task")
    assert "--task-user ''" in line and "chmod o+x" in line


@ROOT_ONLY
def test_up_as_a_normal_user_says_in_one_line_that_tasks_run_as_that_user(gl_shared_dir):
    nobody = pwd.getpwnam("nobody")
    data = gl_shared_dir / "data"
    env = {**os.environ, "HOME": str(gl_shared_dir)}
    argv = [PY, "-m", "gpulayer", "up", "--data-dir", str(data), "--no-save-config",
            "--port", str(free_port())]  # fmt: skip
    with subprocess.Popen(
        argv, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], env=env,
        cwd=gl_shared_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stderr is not None and proc.stdout is not None
            notes = [proc.stderr.readline(), proc.stderr.readline()]
            [line] = [n for n in notes if n.startswith("note:")]
            assert "local tasks run as you (nobody) and can read your files" in line
            url = next(ln.split()[-1] for ln in proc.stdout if ln.startswith("control plane:"))
            with Connection(url, (data / "admin.token").read_text().strip()) as conn:
                job = gl.submit(["id", "-u"], connection=conn).wait(timeout=60)
                assert job.logs()[-1] == str(nobody.pw_uid)  # as said: tasks are nobody's
        finally:
            proc.terminate()


def test_two_owners_each_run_cells_in_their_own_session_main_on_one_worker(cluster, conn):
    names = ("carol", "dave")
    tokens = {n: conn.create_token(contracts.CreateToken(name=n, role="submitter")).token
              for n in names}  # fmt: skip

    def cell(c: Connection, source: str) -> str:
        spec = contracts.JobSpec(kind="cell", cell={"source": source, "session": "main"})
        job = c.wait(c.submit(spec).id, timeout=90)
        assert job.state == "succeeded", job.reason
        return "".join(ln.text for ln in c.logs(job.id).lines)

    conns = {n: Connection(cluster.url, tokens[n]) for n in names}
    try:
        for n in names:
            conns[n].create_session(contracts.CreateSession(name="main"))
        for n in names:
            cell(conns[n], f"owner = {n!r}")
        for n in names:  # each kernel kept its own owner's state
            assert f"{n}\\n" in cell(conns[n], "print(owner)")
    finally:
        for n in names:
            conns[n].end_session("main")
            conns[n].close()
