"""The scheduler on a real SQLite file with an injected clock (no HTTP, no sleeps)."""

import asyncio
import functools
from datetime import UTC, datetime

import pytest

from gpulayer.contracts import (
    Heartbeat,
    JobSpec,
    LogBatch,
    LogEntry,
    TaskCompletion,
    WorkerRegistration,
)
from gpulayer.errors import InvalidTransition, NotFound, StaleAttempt
from jupyter_ext.artifacts import BlobStore
from jupyter_ext.auth import Principal, TokenService
from jupyter_ext.control_plane import ControlPlane
from jupyter_ext.store import SCHEMA_VERSION, Store
from jupyter_ext.streams import Notifier

from .planes import Clock, plane_on


@pytest.fixture
def world(tmp_path):
    return functools.partial(plane_on, tmp_path, heartbeat_seconds=1.0, lease_seconds=10.0)


def reg(name, gpus=0, slots=2):
    devices = [
        {"index": i, "kind": "cuda", "name": "A100", "memory_bytes": 80 << 30, "simulated": True}
        for i in range(gpus)
    ]
    return WorkerRegistration(
        name=name,
        hostname=name,
        cpus=4,
        memory_bytes=16 << 30,
        devices=devices,
        slots=slots,
        version="t",
    )


def spec(**kw):
    return JobSpec(command=["true"], **kw)


def entry(text):
    return LogEntry(stream="stdout", ts=datetime.now(UTC), text=text)


def as_worker(r):
    return Principal(name="w", role="worker", worker_id=r.worker_id)


def run(coro):
    return asyncio.run(coro)


def test_two_one_gpu_jobs_share_a_two_gpu_worker_on_different_gpus(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("box", gpus=2))
            a = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            b = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            c = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            got = await sched.workers.acquire(r.worker_id, 0)
            assert sorted(x.gpu_indices[0] for x in got.assignments) == [0, 1]
            assert {x.job_id for x in got.assignments} == {a.id, b.id}
            waiting = await sched.jobs.get(c.id)
            assert waiting.state == "queued"
            assert waiting.pending_reasons == ["box: all 2 task slots busy"]
            await sched.tasks.complete(
                as_worker(r),
                got.assignments[0].task_id,
                TaskCompletion(state="succeeded", exit_code=0),
            )
            assert (await sched.jobs.get(c.id)).state == "scheduled"

    run(body())


def test_a_job_too_big_for_every_worker_says_so_per_worker(world):
    async def body():
        async with world() as (sched, _):
            await sched.workers.register(reg("small", gpus=1))
            await sched.workers.register(reg("cpu"))
            job = await sched.jobs.submit(spec(resources={"gpus": 2, "memory": "64GiB"}), "u")
            assert job.pending_reasons == [
                "cpu: needs 64.0 GiB memory, has 16.0 GiB",
                "small: needs 64.0 GiB memory, has 16.0 GiB",
            ]
            job = await sched.jobs.submit(spec(resources={"gpus": 2}), "u")
            assert job.pending_reasons == [
                "cpu: needs 2 × GPU, has no GPUs",
                "small: needs 2 × GPU, has 1",
            ]

    run(body())


def test_priority_goes_first_and_small_jobs_backfill(world):
    async def body():
        async with world() as (sched, _):
            big = await sched.jobs.submit(spec(resources={"gpus": 4}), "u")
            low = await sched.jobs.submit(spec(priority=-1), "u")
            high = await sched.jobs.submit(spec(priority=5), "u")
            r = await sched.workers.register(reg("box", slots=1))
            got = await sched.workers.acquire(r.worker_id, 0)
            assert [x.job_id for x in got.assignments] == [high.id]
            assert (await sched.jobs.get(big.id)).state == "queued"
            await sched.tasks.complete(
                as_worker(r),
                got.assignments[0].task_id,
                TaskCompletion(state="succeeded", exit_code=0),
            )
            got = await sched.workers.acquire(r.worker_id, 0)
            assert [x.job_id for x in got.assignments] == [low.id]

    run(body())


def test_a_silent_worker_goes_unhealthy_then_offline_and_its_task_is_retried(world):
    async def body():
        async with world() as (sched, clock):
            r1 = await sched.workers.register(reg("one", slots=1))
            job = await sched.jobs.submit(spec(retries=1), "u")
            first = (await sched.workers.acquire(r1.worker_id, 0)).assignments[0]
            clock.now += 4
            await sched.leases.sweep()
            assert {w.name: w.state for w in await sched.workers.all()} == {"one": "unhealthy"}
            clock.now += 7  # past the 10 s lease
            await sched.leases.sweep()
            assert {w.name: w.state for w in await sched.workers.all()} == {"one": "offline"}
            j = await sched.jobs.get(job.id)
            assert j.state == "queued" and "lost" in j.reason and "retrying" in j.reason
            r2 = await sched.workers.register(reg("two", slots=1))
            second = (await sched.workers.acquire(r2.worker_id, 0)).assignments[0]
            assert second.job_id == job.id and second.attempt == 2
            # The first worker comes back still running the old attempt: told to kill it.
            hb = await sched.workers.heartbeat(
                r1.worker_id, Heartbeat(running_tasks=[first.task_id])
            )
            assert hb.kill_tasks == [first.task_id]
            # Its late completion is refused (a stale attempt) and does not change the job.
            with pytest.raises(StaleAttempt):
                await sched.tasks.complete(
                    as_worker(r1), first.task_id, TaskCompletion(state="succeeded", exit_code=0)
                )
            assert (await sched.jobs.get(job.id)).state == "running"

    run(body())


def test_lost_without_retries_ends_lost(world):
    async def body():
        async with world() as (sched, clock):
            r = await sched.workers.register(reg("one"))
            job = await sched.jobs.submit(spec(), "u")
            await sched.workers.acquire(r.worker_id, 0)
            clock.now += 11
            await sched.leases.sweep()
            j = await sched.jobs.get(job.id)
            assert j.state == "lost" and j.reason == "worker stopped renewing the lease"

    run(body())


def test_heartbeats_keep_a_long_task_alive(world):
    async def body():
        async with world() as (sched, clock):
            r = await sched.workers.register(reg("one"))
            job = await sched.jobs.submit(spec(), "u")
            t = (await sched.workers.acquire(r.worker_id, 0)).assignments[0]
            for _ in range(5):
                clock.now += 5
                await sched.workers.heartbeat(r.worker_id, Heartbeat(running_tasks=[t.task_id]))
                await sched.leases.sweep()
            assert (await sched.jobs.get(job.id)).state == "running"

    run(body())


def test_a_restarted_worker_that_lost_its_task_reports_it_lost_at_once(world):
    async def body():
        async with world() as (sched, clock):
            r = await sched.workers.register(reg("one"))
            job = await sched.jobs.submit(spec(), "u")
            await sched.workers.acquire(r.worker_id, 0)
            clock.now += 1
            again = await sched.workers.register(reg("one"))
            assert again.worker_id == r.worker_id and again.kill_tasks == []
            assert (await sched.jobs.get(job.id)).state == "lost"

    run(body())


def test_state_machine_refuses_bad_transitions(world):
    async def body():
        async with world() as (sched, _):
            job = await sched.jobs.submit(spec(), "u")
            await sched.jobs.cancel(job.id, "u")
            with pytest.raises(InvalidTransition, match="already cancelled"):
                await sched.jobs.cancel(job.id, "u")
            with pytest.raises(NotFound):
                await sched.jobs.get("missing")

    run(body())


def test_store_migrates_an_empty_file_and_refuses_a_newer_one(tmp_path):
    async def body():
        store = await Store(tmp_path / "a.db").open()
        assert await store.schema_version() == SCHEMA_VERSION
        await store.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        await store.close()
        with pytest.raises(RuntimeError, match="Upgrade gpulayer"):
            await Store(tmp_path / "a.db").open()

    run(body())


def test_reopening_keeps_jobs(tmp_path):
    async def body():
        store = await Store(tmp_path / "a.db").open()
        sched = ControlPlane(store, BlobStore(tmp_path / "b"), Notifier(), TokenService(store))
        job = await sched.jobs.submit(spec(name="keep"), "u")
        await store.close()
        store = await Store(tmp_path / "a.db").open()
        sched = ControlPlane(store, BlobStore(tmp_path / "b"), Notifier(), TokenService(store))
        assert (await sched.jobs.get(job.id)).spec.name == "keep"
        await store.close()

    run(body())


def test_concurrent_writers_share_the_one_connection_safely(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("box", slots=50))
            jobs = await asyncio.gather(*(sched.jobs.submit(spec(), "u") for _ in range(30)))
            got = await sched.workers.acquire(r.worker_id, 0)
            tasks = [a.task_id for a in got.assignments]
            batches = [
                sched.tasks.append_logs(
                    as_worker(r), t, LogBatch(seq=0, lines=[entry(f"{t} {i}") for i in range(5)])
                )
                for t in tasks
            ]
            beats = [
                sched.workers.heartbeat(r.worker_id, Heartbeat(running_tasks=tasks))
                for _ in range(10)
            ]
            await asyncio.gather(*batches, *beats)
            for job in jobs:
                page = await sched.jobs.logs(job.id, 0, 100, 0)
                assert len(page.lines) == 5
                assert [ln.offset for ln in page.lines] == list(range(5))

    run(body())


def test_a_job_that_waited_too_long_stops_backfill_on_workers_that_could_run_it(world):
    async def body():
        async with world(aging_seconds=60) as (sched, clock):
            r = await sched.workers.register(reg("box", gpus=2, slots=4))
            hold = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            big = await sched.jobs.submit(spec(resources={"gpus": 2}), "u")
            small = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            # Young: the small job backfills past the big one onto the free GPU.
            assert (await sched.jobs.get(small.id)).state == "scheduled"
            got = await sched.workers.acquire(r.worker_id, 0)
            by_job = {a.job_id: a.task_id for a in got.assignments}
            await sched.tasks.complete(
                as_worker(r), by_job[small.id], TaskCompletion(state="succeeded", exit_code=0)
            )
            clock.now += 61  # now the big job has waited past aging_seconds
            late = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            assert (await sched.jobs.get(late.id)).state == "queued"
            await sched.tasks.complete(
                as_worker(r), by_job[hold.id], TaskCompletion(state="succeeded", exit_code=0)
            )
            assert (await sched.jobs.get(big.id)).state == "scheduled"
            assert (await sched.jobs.get(late.id)).state == "queued"

    run(body())


def test_a_drained_worker_finishes_but_takes_nothing_new_even_after_going_silent(world):
    async def body():
        async with world() as (sched, clock):
            r = await sched.workers.register(reg("box", slots=2))
            first = await sched.jobs.submit(spec(), "u")
            w = await sched.workers.drain("box")
            assert w.state == "draining" and w.running_tasks
            second = await sched.jobs.submit(spec(), "u")
            assert (await sched.jobs.get(second.id)).pending_reasons == [
                "box: draining: takes no new tasks"
            ]
            clock.now += 5
            await sched.leases.sweep()
            assert [w.state for w in await sched.workers.all()] == ["unhealthy"]
            await sched.workers.heartbeat(r.worker_id, Heartbeat())
            assert [w.state for w in await sched.workers.all()] == ["draining"]
            again = await sched.workers.register(reg("box", slots=2))
            assert again.worker_id == r.worker_id
            assert [w.state for w in await sched.workers.all()] == ["draining"]
            await sched.workers.drain("box", draining=False)
            assert (await sched.jobs.get(second.id)).state == "scheduled"
            assert (await sched.jobs.get(first.id)).state in ("scheduled", "lost")

    run(body())


def test_tasks_placed_on_a_worker_that_died_before_starting_them_go_back_to_the_queue(world):
    async def body():
        async with world() as (sched, clock):
            await sched.workers.register(reg("dead"))
            job = await sched.jobs.submit(spec(), "u")
            assert (await sched.jobs.get(job.id)).state == "scheduled"
            clock.now += 11
            await sched.leases.sweep()
            j = await sched.jobs.get(job.id)
            assert j.state == "queued" and "went offline before starting it" in j.reason
            # Taking the task back is a checked transition with its events.
            events = [(e.state, e.task_id is not None) for e in await sched.jobs.events(job.id)]
            assert events == [
                ("queued", False), ("scheduled", False), ("lost", True), ("queued", False)
            ]  # fmt: skip
            r2 = await sched.workers.register(reg("alive"))
            got = await sched.workers.acquire(r2.worker_id, 0)
            assert [(a.job_id, a.attempt) for a in got.assignments] == [(job.id, 1)]

    run(body())


def test_a_cancelled_job_keeps_the_users_reason_and_the_cancel_is_sent_again(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("box"))
            job = await sched.jobs.submit(spec(), "u")
            t = (await sched.workers.acquire(r.worker_id, 0)).assignments[0]
            await sched.jobs.cancel(job.id, "ada")
            assert (await sched.workers.acquire(r.worker_id, 0)).cancel == [t.task_id]
            # The acquire answer may be lost; the heartbeat repeats the cancel.
            hb = await sched.workers.heartbeat(r.worker_id, Heartbeat(running_tasks=[t.task_id]))
            assert hb.cancel == [t.task_id] and hb.kill_tasks == []
            await sched.tasks.complete(
                as_worker(r),
                t.task_id,
                TaskCompletion(state="cancelled", reason="cancelled by user"),
            )
            j = await sched.jobs.get(job.id)
            assert (j.state, j.reason) == ("cancelled", "cancelled by ada")

    run(body())


def test_a_queued_job_whose_cancel_is_still_committing_is_not_placed(world):
    """A placement pass that starts while a queued job's cancel commits (a commit
    that waits for the writer, as under load) waits for it: the cancelled job gets
    no task and runs nowhere. Before, the pass placed the job from the queue as it
    was before the cancel, and the job ran after its cancel was answered."""

    async def body():
        async with world() as (sched, _):
            job = await sched.jobs.submit(spec(), "u")  # no worker yet: queued
            passes = sched.placer.schedule
            sched.placer.schedule = no_pass  # the worker arrives without placing it
            r = await sched.workers.register(reg("box"))
            sched.placer.schedule = passes
            store = sched.core.store
            commits = store.apply
            entered, go = asyncio.Event(), asyncio.Event()

            async def held(stmts):  # the cancel's commit, held until the pass has run
                entered.set()
                await go.wait()
                await commits(stmts)

            store.apply = held
            cancel = asyncio.ensure_future(sched.jobs.cancel(job.id, "ada"))
            await entered.wait()
            store.apply = commits
            placing = asyncio.ensure_future(sched.placer.schedule())
            for _ in range(100):  # all on the loop: a pass that may run ends within these
                if placing.done():
                    break
                await asyncio.sleep(0)
            go.set()
            await cancel
            await placing
            assert (await sched.jobs.get(job.id)).state == "cancelled"
            assert await sched.core.store.tasks_of_job(job.id) == []
            assert await sched.workers.acquire(r.worker_id, 0) is None

    run(body())


async def no_pass():
    return 0


def test_telemetry_keeps_a_bounded_window_and_the_latest_reading_shows_on_the_worker(world):
    from gpulayer.contracts import GpuSample, TaskSample

    async def body():
        async with world(telemetry_samples=3) as (sched, clock):
            r = await sched.workers.register(reg("box", gpus=1))
            for i in range(5):
                clock.now += 1
                await sched.workers.heartbeat(
                    r.worker_id,
                    Heartbeat(
                        cpu_percent=float(i),
                        gpus=[GpuSample(index=0, utilization_percent=10.0 * i)],
                        tasks=[TaskSample(task_id="t", cpu_percent=1.0, rss_bytes=100)],
                    ),
                )
            tel = await sched.workers.telemetry("box")
            assert [s.cpu_percent for s in tel.samples] == [2.0, 3.0, 4.0]
            [w] = await sched.workers.all()
            assert w.gpus[0].utilization_percent == 40.0 and w.tasks[0].rss_bytes == 100

    run(body())


def test_an_aged_job_reserves_its_workers_even_behind_a_failed_job_of_its_shape(world):
    async def body():
        async with world(aging_seconds=60) as (sched, clock):
            r = await sched.workers.register(reg("box", gpus=2, slots=4))
            hold = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            old_big = await sched.jobs.submit(spec(resources={"gpus": 2}), "u")
            clock.now += 61
            # A younger, higher-priority job of the same shape fails first in the pass.
            await sched.jobs.submit(spec(resources={"gpus": 2}, priority=5), "u")
            small = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            assert (await sched.jobs.get(small.id)).state == "queued"
            assert (await sched.jobs.get(old_big.id)).state == "queued"
            got = await sched.workers.acquire(r.worker_id, 0)
            assert [a.job_id for a in got.assignments] == [hold.id]

    run(body())


def test_a_task_given_up_by_a_stopping_worker_is_not_placed_there_again(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("leaving"))
            job = await sched.jobs.submit(spec(retries=1), "u")
            t = (await sched.workers.acquire(r.worker_id, 0)).assignments[0]
            await sched.tasks.complete(
                as_worker(r), t.task_id, TaskCompletion(state="lost", reason="worker shutting down")
            )
            j = await sched.jobs.get(job.id)
            assert j.state == "queued" and j.pending_reasons == ["leaving: offline"]
            other = await sched.workers.register(reg("other"))
            assert (await sched.workers.acquire(other.worker_id, 0)).assignments[0].job_id == job.id

    run(body())


def test_a_late_heartbeat_built_before_an_acquire_answer_loses_nothing(world):
    async def body():
        async with world() as (sched, clock):
            r = await sched.workers.register(reg("box"))
            first = await sched.workers.acquire(r.worker_id, 0)  # nothing yet
            assert first is None
            job = await sched.jobs.submit(spec(), "u")
            got = await sched.workers.acquire(r.worker_id, 0)
            [a] = got.assignments
            assert got.seq > 0
            # A heartbeat the worker built before that answer reached it, delivered
            # long after the old 2-heartbeat grace: the task keeps running.
            clock.now += 5
            late = Heartbeat(running_tasks=[], acquired_seq=got.seq - 1)
            assert (await sched.workers.heartbeat(r.worker_id, late)).kill_tasks == []
            assert (await sched.jobs.get(job.id)).state == "running"
            # The worker lists it (it has it), then one built after that does not: the
            # worker lost it.
            has = Heartbeat(running_tasks=[a.task_id], acquired_seq=got.seq)
            await sched.workers.heartbeat(r.worker_id, has)
            gone = Heartbeat(running_tasks=[], acquired_seq=got.seq)
            await sched.workers.heartbeat(r.worker_id, gone)
            j = await sched.jobs.get(job.id)
            assert j.state == "lost" and j.reason == "the worker no longer runs it"
            assert [t.id for t in j.tasks] == [a.task_id]

    run(body())


def test_a_task_whose_acquire_answer_never_arrived_goes_back_to_the_queue(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("box"))
            job = await sched.jobs.submit(spec(), "u")
            lost = await sched.workers.acquire(r.worker_id, 0)  # this answer never arrives
            [unheard] = lost.assignments
            await sched.jobs.submit(spec(), "u")
            later = await sched.workers.acquire(r.worker_id, 0)
            [heard] = later.assignments
            # The worker took the later answer and never listed the first task.
            beat = Heartbeat(running_tasks=[heard.task_id], acquired_seq=later.seq)
            assert (await sched.workers.heartbeat(r.worker_id, beat)).kill_tasks == []
            j = await sched.jobs.get(job.id)
            assert j.state in ("queued", "scheduled") and j.attempts <= 1
            assert j.tasks[0].state == "lost" and "never reached" in (j.tasks[0].reason or "")
            again = await sched.workers.acquire(r.worker_id, 0)
            assert [x.job_id for x in again.assignments] == [job.id]
            assert again.assignments[0].task_id != unheard.task_id
            assert again.assignments[0].attempt == 1  # the lost answer's attempt did not count

    run(body())


def test_a_fresh_worker_whose_first_answer_was_lost_gets_the_task_again(world):
    async def body():
        async with world() as (sched, clock):
            r = await sched.workers.register(reg("box"))
            job = await sched.jobs.submit(spec(), "u")
            await sched.workers.acquire(r.worker_id, 0)  # its first answer: never arrives
            clock.now += 3  # past the 2-heartbeat grace of a worker that took no answer
            await sched.workers.heartbeat(r.worker_id, Heartbeat(running_tasks=[]))
            j = await sched.jobs.get(job.id)
            assert j.state in ("queued", "scheduled") and j.attempts <= 1
            # The same name registering as a new process cannot say what it had: lost.
            again = (await sched.workers.acquire(r.worker_id, 0)).assignments[0]
            assert again.job_id == job.id
            clock.now += 1
            await sched.workers.register(reg("box"), worker_id=r.worker_id)
            j = await sched.jobs.get(job.id)
            assert j.state == "lost" and j.reason == "the worker no longer runs it"

    run(body())


async def warm_then_lost(sched):
    """A worker "box" that took one answer (its task runs), then one more job whose
    answer never arrives: the registration, both answers and the second job."""
    r = await sched.workers.register(reg("box"))
    await sched.jobs.submit(spec(), "u")
    warm = await sched.workers.acquire(r.worker_id, 0)  # taken: seen
    job = await sched.jobs.submit(spec(), "u")
    lost = await sched.workers.acquire(r.worker_id, 0)  # never arrives
    return r, warm, job, lost


def test_a_resync_answers_at_once_and_its_heartbeat_takes_back_a_lost_answer(world):
    """A worker whose channel or poll broke asks with ``resync``: the answer comes at
    once, empty when nothing waits, with a seq past every answer before it; the
    heartbeat built once it took it settles the lost task (docs/adr/0150)."""

    async def body():
        async with world() as (sched, _):
            r, warm, job, lost = await warm_then_lost(sched)
            synced = await sched.workers.acquire(r.worker_id, 30, resync=True)  # no wait
            assert synced is not None and synced.assignments == [] and synced.seq > lost.seq
            [heard] = warm.assignments
            beat = Heartbeat(running_tasks=[heard.task_id], acquired_seq=synced.seq)
            await sched.workers.heartbeat(r.worker_id, beat)
            j = await sched.jobs.get(job.id)
            assert j.state in ("queued", "scheduled") and j.attempts <= 1
            assert "never reached" in (j.tasks[0].reason or "")
            assert (await sched.jobs.get(heard.job_id)).state == "running"
            # With work waiting, the resync answer is that work: the job again.
            again = await sched.workers.acquire(r.worker_id, 0, resync=True)
            assert again is not None and again.seq > synced.seq
            assert [a.job_id for a in again.assignments] == [job.id]

    run(body())


def test_a_lost_answer_with_no_later_one_goes_back_to_the_queue_at_its_lease(world):
    async def body():
        async with world() as (sched, clock):
            r, warm, job, _ = await warm_then_lost(sched)
            [heard] = warm.assignments
            for _ in range(11):  # it heartbeats through the 10 s lease without the task
                clock.now += 1
                beat = Heartbeat(running_tasks=[heard.task_id], acquired_seq=warm.seq)
                await sched.workers.heartbeat(r.worker_id, beat)
                await sched.leases.sweep()
            j = await sched.jobs.get(job.id)
            assert j.state in ("queued", "scheduled") and j.attempts <= 1
            assert "never reached" in (j.tasks[0].reason or "")
            assert (await sched.jobs.get(heard.job_id)).state == "running"

    run(body())


def test_acquire_answers_are_numbered_upwards_even_when_the_clock_stands_still(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("box", slots=4))
            seqs = []
            for _ in range(3):
                await sched.jobs.submit(spec(), "u")
                seqs.append((await sched.workers.acquire(r.worker_id, 0)).seq)
            assert seqs == sorted(set(seqs))

    run(body())


def test_with_the_default_timings_a_dead_workers_task_is_retried_within_15_seconds(tmp_path):
    async def body():
        clock = Clock()
        store = await Store(tmp_path / "gl.db").open()
        try:
            tokens = TokenService(store, clock)
            sched = ControlPlane(store, BlobStore(tmp_path / "b"), Notifier(), tokens, clock=clock)
            r1 = await sched.workers.register(reg("one", slots=1))
            job = await sched.jobs.submit(spec(retries=1), "u")
            [a] = (await sched.workers.acquire(r1.worker_id, 0)).assignments
            await sched.workers.heartbeat(r1.worker_id, Heartbeat(running_tasks=[a.task_id]))
            died = clock.now  # right after its last heartbeat: the worst case
            r2 = await sched.workers.register(reg("two", slots=1))
            while (await sched.jobs.get(job.id)).attempts < 2:
                assert clock.now - died <= 15, "the task was not retried within 15 s"
                clock.now += 1.0  # the sweep's default period
                await sched.workers.heartbeat(r2.worker_id, Heartbeat())  # only "two" lives
                await sched.leases.sweep()
            retried = await sched.jobs.get(job.id)
            assert [t.worker_name for t in retried.tasks] == ["one", "two"]
        finally:
            await store.close()

    run(body())
