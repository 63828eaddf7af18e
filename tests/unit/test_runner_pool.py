"""The warm runner pool with real runner processes (driven with ``asyncio.run``)."""

import asyncio
import os

import psutil

from gpulayer import contracts as c
from gpulayer import payload
from gpulayer.worker.environments import EnvRef
from gpulayer.worker.functions import FunctionRun, RunnerPool, key_for

from ..support import until_async


def _assignment(fn, *args, gpus=(), timeout=None, env=None, owner="") -> tuple[c.Assignment, bytes]:
    data = payload.pack_calls(fn, [(args, {})])
    spec = c.JobSpec(
        kind="function",
        function={"format": payload.FORMAT, "python": payload.PYTHON, "payload": data},
        timeout=timeout,
        env=env or {},
    )
    return c.Assignment(
        task_id="t1", job_id="j1", attempt=1, spec=spec, gpu_indices=list(gpus), owner=owner
    ), data


async def _call(pool, tmp_path, fn, *args, lines=None, **kw):
    a, data = _assignment(fn, *args, **kw)
    sink = lines if lines is not None else []
    run = FunctionRun(
        pool, a, data, env={"GPULAYER_TASK_ID": "t1"}, cwd=tmp_path,
        on_line=lambda s, t, ts: sink.append((s, t)),
    )  # fmt: skip
    return await run.run(), run


def _value(outcome):
    return payload.unpack(outcome.result, "outcomes")[0].value


def test_calls_reuse_one_runner_and_see_the_per_call_env(tmp_path):
    async def main():
        pool = RunnerPool(dict(os.environ), max_idle=2, prestart=0)
        try:
            first, _ = await _call(
                pool, tmp_path, lambda: (os.getpid(), os.environ["GPULAYER_TASK_ID"])
            )
            second, _ = await _call(pool, tmp_path, lambda: os.getpid())
            return _value(first), _value(second)
        finally:
            await pool.close()

    (pid, task), pid2 = asyncio.run(main())
    assert pid == pid2 and pid != os.getpid()
    assert task == "t1"


def test_prints_arrive_in_order_before_the_result(tmp_path):
    def chatty():
        import sys

        for i in range(3):
            print(f"line {i}")
        print("oops", file=sys.stderr)
        print("no newline at the end", end="")
        return "done"

    async def main():
        pool = RunnerPool(dict(os.environ), prestart=0)
        lines: list = []
        try:
            outcome, _ = await _call(pool, tmp_path, chatty, lines=lines)
            return outcome, lines
        finally:
            await pool.close()

    outcome, lines = asyncio.run(main())
    assert _value(outcome) == "done"
    assert [(s.value, t) for s, t in lines] == [
        ("stdout", "line 0"), ("stdout", "line 1"), ("stdout", "line 2"),
        ("stderr", "oops"), ("stdout", "no newline at the end"),
    ]  # fmt: skip


def test_a_crash_fails_only_its_call_and_the_pool_replaces_the_runner(tmp_path):
    async def main():
        pool = RunnerPool(dict(os.environ), max_idle=1, prestart=0)
        try:
            crashed, _ = await _call(pool, tmp_path, lambda: os._exit(7))
            after, _ = await _call(pool, tmp_path, lambda: 41 + 1)
            return crashed, after
        finally:
            await pool.close()

    crashed, after = asyncio.run(main())
    assert crashed.state == "failed" and crashed.exit_code == 7 and crashed.retry
    assert "exited with code 7" in crashed.reason
    assert _value(after) == 42


def test_timeout_and_cancel_kill_the_runner(tmp_path):
    async def main():
        pool = RunnerPool(dict(os.environ), prestart=0)
        try:
            import time

            timed, _ = await _call(pool, tmp_path, lambda: time.sleep(30), timeout=0.5)
            a, data = _assignment(lambda: __import__("time").sleep(30))
            run2 = FunctionRun(pool, a, data, env={}, cwd=tmp_path, on_line=lambda *x: None)
            task = asyncio.create_task(run2.run())
            await until_async(lambda: run2.pid is not None, what="the runner to start")
            pid = run2.pid
            run2.cancel("cancelled by test")
            cancelled = await task
            return timed, cancelled, pid
        finally:
            await pool.close()

    timed, cancelled, pid = asyncio.run(main())
    assert timed.state == "timed_out" and "0.5" in timed.reason
    assert cancelled.state == "cancelled" and cancelled.reason == "cancelled by test"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_runners_are_recycled_after_max_calls_and_keyed_by_reservation(tmp_path):
    async def main():
        pool = RunnerPool(dict(os.environ), max_idle=4, max_calls=2, prestart=0)
        try:
            pids = [_value((await _call(pool, tmp_path, lambda: os.getpid()))[0]) for _ in range(3)]
            gpu = _value(
                (
                    await _call(
                        pool,
                        tmp_path,
                        lambda: (os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"]),
                        gpus=(1,),
                    )
                )[0]
            )
            return pids, gpu
        finally:
            await pool.close()

    pids, (gpu_pid, visible) = asyncio.run(main())
    assert pids[0] == pids[1] != pids[2]  # the third call gets a fresh runner
    assert visible == "1" and gpu_pid not in pids


def test_a_raised_exception_is_not_retried_by_default(tmp_path):
    async def main():
        pool = RunnerPool(dict(os.environ), prestart=0)
        try:
            return (await _call(pool, tmp_path, lambda: 1 / 0))[0]
        finally:
            await pool.close()

    outcome = asyncio.run(main())
    assert outcome.state == "failed" and not outcome.retry
    assert outcome.reason == "raised ZeroDivisionError: division by zero"


def test_pool_key_includes_the_owner_the_job_env_and_the_python_env():
    a, _ = _assignment(lambda: 1, gpus=(0,), env={"B": "2", "A": "1"}, owner="ada")
    assert key_for(a) == ("ada", (0,), (("A", "1"), ("B", "2")), None)
    ref = EnvRef("k" * 32, "/envs/" + "k" * 32, isolated=False)
    assert key_for(a, ref)[3] == ref and key_for(a, ref) != key_for(a)


def test_a_fresh_runner_is_claimed_by_its_first_owner_and_never_serves_another(tmp_path):
    async def main():
        pool = RunnerPool(dict(os.environ), max_idle=4, prestart=1)
        pool.start()
        try:
            await until_async(lambda: pool.idle_count(pool.PLAIN), what="the prestarted runner")
            [warm] = pool._idle[pool.PLAIN]
            pids = {}
            for owner in ("ada", "ada", "bob"):
                a, data = _assignment(lambda: os.getpid(), owner=owner)
                run = FunctionRun(pool, a, data, env={}, cwd=tmp_path, on_line=lambda *_: None)
                pids.setdefault(owner, set()).add(_value(await run.run()))
            return warm.proc.pid, pids
        finally:
            await pool.close()

    warm, pids = asyncio.run(main())
    assert pids["ada"] == {warm}  # ada claimed the prestarted runner and kept it
    assert warm not in pids["bob"]  # bob got one of his own


def test_trims_that_overlap_close_each_surplus_runner_once(tmp_path):
    # Spares and give_backs trim the pool concurrently (a busy .map does this): each
    # surplus runner must leave the pool once, never "list.remove(x): x not in list".
    async def main():
        pool = RunnerPool(dict(os.environ), max_idle=3, prestart=0)
        try:
            runners = await asyncio.gather(*(pool.take(pool.PLAIN) for _ in range(3)))
            for r in runners:
                await pool.give_back(r)
            pool.max_idle = 0
            await asyncio.gather(pool.trim(), pool.trim())
            return pool.idle_count(), [r.alive for r in runners]
        finally:
            await pool.close()

    left, alive = asyncio.run(main())
    assert left == 0 and alive == [False, False, False]


def test_the_prestart_says_whether_a_runner_came_up_and_why_not(tmp_path, caplog):
    """What a worker whose tasks run as another user takes as its proof that the user
    can run this Python: a runner that came up; else why it did not, kept for the
    worker to explain (not logged as an error by the pool)."""

    async def main(env):
        pool = RunnerPool(env, max_idle=2, prestart=1)
        try:
            pool.start(quiet=True)
            return await pool.prestarted(), pool.idle_count()
        finally:
            await pool.close()

    assert asyncio.run(main(dict(os.environ))) == (None, 1)
    broken = {**os.environ, "GPULAYER_PYTHON": str(tmp_path / "no-python")}
    with caplog.at_level("INFO", logger="gpulayer.worker.functions"):
        failed, idle = asyncio.run(main(broken))
    assert isinstance(failed, OSError) and idle == 0
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
