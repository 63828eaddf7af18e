"""@gl.remote against a live control plane and a real worker with warm runners."""

import importlib
import os
import sys
import threading
import time

import numpy as np
import psutil
import pytest

import gpulayer as gl
from gpulayer import contracts, errors, payload
from gpulayer.client import Connection

from ..support import until


class BudgetExceeded(Exception):
    """A user-defined exception type (pickled by value: this test module is local)."""

    def __init__(self, spent: int) -> None:
        super().__init__(f"spent {spent}")
        self.spent = spent


@pytest.fixture
def rf(conn):
    """``gl.remote`` bound to the test's connection."""

    def make(fn=None, **options):
        return (
            gl.remote(fn, connection=conn, **options)
            if fn
            else gl.remote(connection=conn, **options)
        )

    return make


def test_run_returns_the_value_and_keeps_the_signature(rf):
    @rf(cpus=0.5)
    def scale(x: int, *, by: int = 2) -> dict:
        """Scale x."""
        return {"x": x * by, "pid": os.getpid()}

    got = scale.run(21, by=2)
    assert got["x"] == 42
    assert got["pid"] != os.getpid()  # it ran elsewhere
    assert scale.__name__ == "scale" and scale.__doc__ == "Scale x."
    assert list(__import__("inspect").signature(scale).parameters) == ["x", "by"]
    assert scale(1, by=3)["x"] == 3  # a direct call stays local


def test_warm_runner_is_reused_across_calls(rf):
    where = rf(lambda: os.getpid())
    first = where.run()
    assert where.run() == first == where.run()


def _cwd_seen(*, write: bool = False, loosen: bool = False) -> tuple[int, int, list[str]]:
    """A call's cwd as it found it: inode, mode, entries; then maybe leave a file, or
    open the folder to everyone."""
    import stat

    st = os.stat(".")
    seen = sorted(os.listdir("."))
    if write:
        with open("left.txt", "w") as f:
            f.write("x")
    if loosen:
        os.chmod(".", 0o777)
    return st.st_ino, stat.S_IMODE(st.st_mode), seen


def test_each_call_starts_in_an_empty_private_folder_never_one_of_another_owner(cluster, conn):
    # An empty call folder is reused for its owner's next call (ADR 0145).
    tokens = {}
    for name in ("ada-folders", "bob-folders"):
        req = contracts.CreateToken(name=name, role="submitter")
        tokens[name] = conn.create_token(req).token
    with (
        Connection(cluster.url, tokens["ada-folders"]) as ada,
        Connection(cluster.url, tokens["bob-folders"]) as bob,
    ):
        here = gl.remote(_cwd_seen, connection=ada)
        first, mode, seen = here.run(loosen=True)
        assert (mode, seen) == (0o700, [])
        again, mode, seen = here.run(write=True)
        assert again == first  # the same folder, emptied by nobody: it was empty
        assert (mode, seen) == (0o700, [])  # private again
        _, mode, seen = here.run()
        assert (mode, seen) == (0o700, [])  # the file left: a new folder
        parked, _, _ = here.run()
        theirs, mode, seen = gl.remote(_cwd_seen, connection=bob).run()
        assert theirs != parked and (mode, seen) == (0o700, [])


def test_builtin_exception_is_reraised_with_the_remote_line(rf):
    def divide(a, b):
        return a / b  # the remote line

    with pytest.raises(ZeroDivisionError) as info:
        rf(divide).run(1, 0)
    cause = info.value.__cause__
    assert isinstance(cause, errors.RemoteTraceback)
    assert "in divide" in str(cause)
    assert "return a / b  # the remote line" in str(cause)
    assert __file__ in str(cause)
    assert any("on worker local-1" in note for note in info.value.__notes__)


def test_user_defined_exception_type_is_the_same_class(rf):
    def spend(n):
        raise BudgetExceeded(n)

    with pytest.raises(BudgetExceeded) as info:
        rf(spend).run(7)
    assert info.value.spent == 7


def test_exception_that_cannot_travel_is_a_remote_error(rf):
    def raise_with_a_lock():
        import threading

        e = RuntimeError("holding a lock")
        e.lock = threading.Lock()  # locks do not pickle
        raise e

    with pytest.raises(errors.RemoteError) as info:
        rf(raise_with_a_lock).run()
    assert info.value.remote_type == "RuntimeError"
    assert "holding a lock" in str(info.value)
    assert "raise e" in info.value.remote_traceback
    assert info.value.job_id in str(info.value)


def test_map_keeps_order_and_batches(rf, conn):
    square = rf(lambda x: x * x)
    before = len(conn.jobs(limit=10000))
    results = square.map(range(200), chunk_size=25)
    assert list(results) == [x * x for x in range(200)]
    assert len(conn.jobs(limit=10000)) - before == 8  # 200 calls in 8 jobs


def test_map_unordered_yields_everything(rf):
    def slow_first(x):
        import time

        time.sleep(0.5 if x == 0 else 0)
        return x

    got = list(rf(slow_first).map(range(6), ordered=False, chunk_size=1))
    assert sorted(got) == list(range(6))
    assert got[0] != 0  # the slow one does not hold the others back


def test_map_return_exceptions(rf):
    def invert(x):
        return 1 / x

    got = list(rf(invert).map([1, 0, 4], return_exceptions=True, chunk_size=1))
    assert got[0] == 1.0 and got[2] == 0.25
    assert isinstance(got[1], ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        list(rf(invert).map([1, 0, 4]))


def test_spawn_cancel_stops_the_runner_and_the_pool_recovers(rf, conn):
    def sleeper():
        import os
        import time

        print(f"pid {os.getpid()}", flush=True)
        time.sleep(60)

    call = rf(sleeper).spawn()
    line = until(lambda: [x for x in call.logs() if x.startswith("pid ")], what="pid line")
    pid = int(line[0].split()[1])
    assert psutil.pid_exists(pid)
    assert not call.done()
    assert call.cancel()
    with pytest.raises(errors.JobFailed) as info:
        call.result(timeout=20)
    assert info.value.state == "cancelled"
    until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
          what="runner process stopped")  # fmt: skip
    assert rf(lambda: 5).run() == 5  # another runner serves the next call


def test_timeout_kills_the_call(rf):
    import_time = rf(lambda: time.sleep(30), timeout=1)
    started = time.monotonic()
    with pytest.raises(errors.JobFailed) as info:
        import_time.run()
    assert info.value.state == "timed_out"
    assert time.monotonic() - started < 20


def test_runner_crash_fails_only_its_call_and_retries(rf, gl_shared_dir):
    marker = gl_shared_dir / "crashed-once"

    def crash_once(path):
        import os
        import pathlib

        if not pathlib.Path(path).exists():
            pathlib.Path(path).write_text("x")
            os._exit(3)
        return "second attempt"

    assert rf(crash_once, retries=1).run(str(marker)) == "second attempt"
    with pytest.raises(errors.JobFailed) as info:
        rf(lambda: os._exit(3)).run()
    assert info.value.state == "failed"
    assert "exited with code 3" in (info.value.reason or "")


def test_function_from_a_local_module_not_installed_anywhere(rf, tmp_path, monkeypatch):
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    (mod_dir / "glhelpers_xyz.py").write_text(
        "import importlib.util\n"
        "def shout(word):\n"
        "    return word.upper() + '!'\n"
        "def where():\n"
        "    return importlib.util.find_spec('glhelpers_xyz') is None\n"
    )
    monkeypatch.syspath_prepend(str(mod_dir))
    mod = importlib.import_module("glhelpers_xyz")
    try:
        assert rf(mod.shout).run("hi") == "HI!"
        assert rf(mod.where).run() is True  # the worker cannot import it: it came by value
    finally:
        sys.modules.pop("glhelpers_xyz", None)


def test_large_numpy_argument_goes_through_the_blob_store(rf, conn):
    big = np.ones(25_000_000, dtype=np.float64)  # 200 MB
    call = rf(lambda a: (float(a.sum()), a.nbytes)).spawn(big)
    assert call.info.spec.function.payload is None
    assert call.info.spec.function.payload_blob is not None
    assert call.result(timeout=110) == (25_000_000.0, 200_000_000)


def test_large_result_comes_back_through_the_result_route(rf):
    call = rf(lambda n: b"x" * n).spawn(3 * contracts.INLINE_BYTES)
    assert call.result(timeout=60) == b"x" * (3 * contracts.INLINE_BYTES)
    assert call.info.result is None and call.info.result_size > contracts.INLINE_BYTES
    # .run reads its answer as a JobEnd (no spec): the large result is fetched all the same
    assert rf(lambda n: b"y" * n).run(3 * contracts.INLINE_BYTES) == b"y" * (
        3 * contracts.INLINE_BYTES
    )


def test_prints_stream_into_run_and_logs(rf, capsys):
    def chatty():
        import sys

        print("hello from the worker")
        print("a warning", file=sys.stderr)
        return 1

    assert rf(chatty).run() == 1
    out, err = capsys.readouterr()
    assert "hello from the worker" in out
    assert "a warning" in err


def test_unpicklable_argument_fails_before_submission(rf, conn):
    before = len(conn.jobs(limit=10000))
    with pytest.raises(errors.PayloadError) as info:
        rf(lambda x: x).run(threading.Lock())
    assert "cannot send a call" in str(info.value) and "lock" in str(info.value)
    assert len(conn.jobs(limit=10000)) == before


def test_python_version_mismatch_is_explained(conn, monkeypatch):
    spec = contracts.JobSpec(
        kind="function",
        function={"format": 1, "python": "3.10", "payload": b"-"},
        resources={"cpus": 0.1},
    )
    monkeypatch.setattr(payload, "PYTHON", "3.10")
    data = payload.pack_calls(lambda: 1, [((), {})])
    monkeypatch.undo()
    spec.function.payload = data
    call = gl.Call(conn, conn.submit(spec))
    with pytest.raises(errors.PayloadError) as info:
        call.result(timeout=30)
    assert "Python version mismatch" in str(info.value)
    assert "made by Python 3.10" in str(info.value)


def test_options_spawn_wait_and_as_completed(rf):
    base = rf(lambda x: x + 1)
    named = base.options(name="renamed", retries=1)
    calls = [named.spawn(i) for i in range(4)]
    assert {c.info.spec.name for c in calls} == {"renamed"}
    assert calls[0].info.spec.retries == 1
    done, not_done = gl.wait(calls, timeout=60)
    assert not not_done and len(done) == 4
    assert sorted(c.result() for c in gl.as_completed(calls)) == [1, 2, 3, 4]


def test_gpu_reservation_is_visible_in_the_runner(rf):
    got = rf(lambda: os.environ["CUDA_VISIBLE_DEVICES"], gpus=1).run()
    assert got in ("0", "1")


def test_workers_on_another_python_are_refused_before_submission(fresh_cluster):
    import httpx

    c = fresh_cluster(workers=0)
    reg = {"name": "py399", "hostname": "elsewhere", "cpus": 2, "memory_bytes": 1 << 30,
           "version": "0.1.0", "python": "3.99"}  # fmt: skip
    resp = httpx.post(
        c.url + "gpulayer/api/v1/workers/register",
        json=reg,
        headers={"Authorization": f"Bearer {c.join_token}"},
    )
    assert resp.status_code == 200, resp.text
    with c.connection() as conn:
        with pytest.raises(errors.PayloadError) as info:
            gl.remote(lambda: 1, connection=conn).run()
        assert "Python version mismatch" in str(info.value)
        assert "py399: 3.99" in str(info.value)
        assert conn.jobs() == []


def test_stopping_a_map_early_cancels_the_rest(rf, conn):
    def slow(x):
        import time

        if x > 0:
            time.sleep(60)
        return x

    run = rf(slow).map(range(6), chunk_size=1, max_parallel=3)
    assert next(run) == 0
    run.close()
    for job_id in run.job_ids[1:]:
        until(lambda j=job_id: conn.job(j).state == "cancelled", what=f"job {job_id} cancelled")
    assert len(run.job_ids) == 4  # three ran at a time; the rest were never submitted
