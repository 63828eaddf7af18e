"""Placement by the queue index (jupyter_ext/queue.py, docs/adr/0114): many queued
jobs of a few shapes, on a real SQLite file with an injected clock."""

import pytest

from gpulayer.contracts import JobSpec, JobState, TaskCompletion
from gpulayer.errors import Conflict
from jupyter_ext import transitions
from jupyter_ext.store import JobRecord, Store

from . import test_scheduler
from .planes import plane_on
from .test_scheduler import as_worker, reg, run

world = test_scheduler.world  # the scheduler fixture, shared


def cmd(**kw):
    return JobSpec(command=["true"], **kw)


def gang(**kw):
    return JobSpec(kind="distributed", command=["python", "train.py"], nodes=2, **kw)


async def queue_many(sched, n):
    """``n`` jobs of each of four shapes, interleaved, with no worker registered."""
    ids: dict[str, list[str]] = {"unsat": [], "gang": [], "cpu": [], "gpu": []}
    for _ in range(n):
        batch = {
            "unsat": cmd(resources={"gpus": 8}, priority=9),  # no worker has 8 GPUs
            "gang": gang(resources={"gpus": 1}, priority=5),  # one worker could run a node
            "cpu": cmd(priority=1),
            "gpu": cmd(resources={"gpus": 1}),
        }
        jobs = await sched.jobs.submit_many(list(batch.values()), "u")
        for name, job in zip(batch, jobs, strict=True):
            ids[name].append(job.id)
    return ids


def test_a_pass_over_a_long_queue_places_by_priority_then_submission(world, monkeypatch):
    async def body():
        async with world() as (sched, _):
            ids = await queue_many(sched, 100)
            read = JobRecord.from_row
            rows = 0

            def counted(r):
                nonlocal rows
                rows += 1
                return read(r)

            monkeypatch.setattr(JobRecord, "from_row", counted)
            # 400 queued; one worker with 2 GPUs and 4 slots appears, and its pass ...
            await sched.workers.register(reg("box", gpus=2, slots=4))
            monkeypatch.undo()
            # ... reads, per shape, at most as many rows as it has free slots to fill
            # (4 shapes, 4 slots), never the whole queue (400 jobs).
            assert rows <= 4 * 4
            # Priority first (cpu, priority 1), in submission order; the gang holds
            # nothing; the unsatisfiable shape is skipped.
            placed = [j for j in await sched.jobs.by_ids(ids["cpu"]) if j.state != "queued"]
            assert [j.id for j in placed] == ids["cpu"][:4]
            assert all(j.state == "queued" for j in await sched.jobs.by_ids(ids["gang"]))
            assert all(j.state == "queued" for j in await sched.jobs.by_ids(ids["unsat"]))

    run(body())


def test_gpu_jobs_backfill_past_an_unsatisfiable_shape_and_a_gang_in_fifo_order(world):
    async def body():
        async with world() as (sched, _):
            ids = await queue_many(sched, 100)
            for job_id in ids["cpu"]:  # only the one-GPU jobs are left to place
                await sched.jobs.cancel(job_id, by="u")
            r = await sched.workers.register(reg("box", gpus=2, slots=4))
            got = await sched.workers.acquire(r.worker_id, 0)
            # Two GPUs: the first two GPU jobs, on different GPUs; the gang (it needs
            # two workers) took none of them, and the 8-GPU jobs wait.
            assert [a.job_id for a in got.assignments] == ids["gpu"][:2]
            assert sorted(a.gpu_indices[0] for a in got.assignments) == [0, 1]
            gang_job = await sched.jobs.get(ids["gang"][0])
            assert gang_job.state == "queued" and gang_job.tasks == []
            unsat = await sched.jobs.get(ids["unsat"][0])
            assert unsat.unsatisfiable
            # Completing one frees a GPU: the next GPU job in submission order.
            await sched.tasks.complete(
                as_worker(r),
                got.assignments[0].task_id,
                TaskCompletion(state="succeeded", exit_code=0),
            )
            nxt = await sched.jobs.by_ids(ids["gpu"][2:4])
            assert [j.state for j in nxt] == ["scheduled", "queued"]

    run(body())


def test_a_retried_job_goes_back_to_its_place_ahead_of_later_jobs_of_its_shape(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("box", slots=1))
            first = await sched.jobs.submit(cmd(retries=1), "u")
            later = [await sched.jobs.submit(cmd(), "u") for _ in range(3)]
            [a] = (await sched.workers.acquire(r.worker_id, 0)).assignments
            assert a.job_id == first.id
            await sched.tasks.complete(
                as_worker(r), a.task_id, TaskCompletion(state="failed", exit_code=1)
            )
            # Back in the queue, and first again: it was submitted before the others.
            assert (await sched.jobs.get(first.id)).state == "scheduled"
            assert all(j.state == "queued" for j in await sched.jobs.by_ids([j.id for j in later]))

    run(body())


def test_jobs_queued_before_a_restart_are_placed_in_order_after_it(tmp_path):
    async def body():
        async with plane_on(tmp_path) as (sched, _):
            big = await sched.jobs.submit(cmd(resources={"gpus": 4}), "u")
            ids = [(await sched.jobs.submit(cmd(resources={"gpus": 1}), "u")).id for _ in range(5)]
        async with plane_on(tmp_path) as (sched, _):
            await sched.workers.register(reg("box", gpus=2, slots=4))
            jobs = await sched.jobs.by_ids(ids)
            assert [j.state for j in jobs] == ["scheduled"] * 2 + ["queued"] * 3
            assert (await sched.jobs.get(big.id)).state == "queued"

    run(body())


def test_a_rolled_back_submit_leaves_the_queue_as_the_file(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            spec = cmd().model_dump_json()
            await store.apply(transitions.submitted(1.0, "a", spec, "ada", 0))
            with pytest.raises(Conflict):  # "a" again: the whole transaction rolls back
                await store.apply(
                    transitions.submitted(1.0, "b", spec, "ada", 0)
                    + transitions.submitted(1.0, "a", spec, "ada", 0)
                )
            assert sorted(store.queued.refs) == ["a"] and store.queued.count("ada") == 1
            job = await store.get_job("a")
            await store.apply(transitions.job_to(2.0, job, JobState.cancelled, "no"))
            assert len(store.queued) == 0 and store.queued.count("ada") == 0
        finally:
            await store.close()

    run(body())


def test_a_queued_job_says_how_many_queued_jobs_come_before_it_across_a_restart(tmp_path):
    """The count of jobs ahead follows priority, then submission, and every change
    of the queue (it is read from memory, not counted in SQLite, benchmarks/burst.py)."""

    async def behind(sched, job_id):
        reasons = (await sched.jobs.get(job_id)).pending_reasons
        return [r for r in reasons if r.startswith("behind")]

    async def body():
        async with plane_on(tmp_path) as (sched, _):
            await sched.workers.register(reg("box", gpus=1, slots=4))
            held = await sched.jobs.submit(cmd(resources={"gpus": 1}), "u")
            assert held.state == "scheduled"
            a, b, c, d = [
                (await sched.jobs.submit(cmd(resources={"gpus": 1}, priority=p), "u")).id
                for p in (0, 5, 0, 5)
            ]
            one, two, three = (
                f"behind {n} (higher priority or older)"
                for n in ("1 queued job", "2 queued jobs", "3 queued jobs")
            )
            # placement order: b, d (priority 5), then a, c
            assert [await behind(sched, j) for j in (b, d, a, c)] == [[], [one], [two], [three]]
            await sched.jobs.cancel(b, by="u")
            assert [await behind(sched, j) for j in (d, a, c)] == [[], [one], [two]]
        async with plane_on(tmp_path) as (sched, _):  # the queue as the file has it
            await sched.workers.register(reg("box2", gpus=1, slots=4))
            # box2's GPU took d; a and c wait for box's GPU (still held) or box2's
            assert (await sched.jobs.get(d)).state == "scheduled"
            assert [await behind(sched, j) for j in (a, c)] == [[], [one]]

    run(body())
