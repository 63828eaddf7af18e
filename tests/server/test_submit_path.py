"""The warm call path (issue 20, docs/adr/0133 and 0112) on a real SQLite file: a
submit stored with its placement and start in one transaction and handed to the
worker's waiting acquire; a caller waiting for a function's end, and a cell's
follower waiting for its lines, answered while the commit runs, with exactly what
the store says once it has."""

import asyncio
import functools
from datetime import UTC, datetime

import pytest

from gpulayer.contracts import JobSpec, LogBatch, LogEntry, TaskCompletion
from jupyter_ext.store import Store

from .planes import plane_on
from .test_scheduler import as_worker, reg, run, spec

CALL = {"format": 1, "python": "3.11", "payload": b"-"}


def call_spec(**kw):
    return JobSpec(kind="function", function=CALL, **kw)


@pytest.fixture
def world(tmp_path):
    return functools.partial(plane_on, tmp_path, heartbeat_seconds=1.0, lease_seconds=10.0)


def test_a_submit_while_its_worker_waits_is_placed_and_started_in_one_commit(world, tmp_path):
    async def body():
        async with world() as (cp, _):
            r = await cp.workers.register(reg("box"))
            waiting = asyncio.ensure_future(cp.workers.acquire(r.worker_id, 5))
            await asyncio.sleep(0)  # the acquire is parked, as a worker's channel keeps it
            writes = []
            apply = cp.store.apply

            async def counted(stmts):
                writes.append(len(stmts))
                await apply(stmts)

            cp.store.apply = counted  # type: ignore[method-assign]
            job = await cp.jobs.submit(call_spec(), "u")
            cp.store.apply = apply  # type: ignore[method-assign]
            got = await asyncio.wait_for(waiting, 5)
            assert job.state == "running"  # started before the submit answered
            assert [a.job_id for a in got.assignments] == [job.id]
            assert len(writes) == 1  # submit, placement and start: one transaction
            events = [(e.state, e.reason) for e in await cp.jobs.events(job.id)]
            assert events == [  # every transition recorded, as when placed and started apart
                ("queued", "submitted by u"),
                ("scheduled", "placed on box"),
                ("running", "picked up by worker"),
                ("running", "running"),
            ]
            # the rows are stored as a later start would leave them: one attempt,
            # the task running under its lease (what the lease sweep reads)
            task = await cp.store.get_task(got.assignments[0].task_id)
            assert task is not None and task.state == "running" and task.attempt == 1
            assert task.started_at is not None and task.lease_expires is not None
            assert task.lease_expires == pytest.approx(task.started_at + 10.0)
            assert cp.store.active_holds.running(task.id)  # not waiting to start
        # durable: a fresh store reads it running on the worker
        store = await Store(tmp_path / "gl.db").open()
        try:
            row = await store.get_job(job.id)
            assert row is not None and row.state == "running" and row.worker_id == r.worker_id
            assert row.attempts == 1 and row.started_at is not None
        finally:
            await store.close()

    run(body())


def test_a_submit_with_no_acquire_waiting_is_placed_and_picked_up_later(world):
    async def body():
        async with world() as (cp, _):
            r = await cp.workers.register(reg("box"))
            job = await cp.jobs.submit(call_spec(), "u")
            assert job.state == "scheduled" and job.worker_name == "box"
            assert job.attempts == 1 and job.started_at is None
            events = [e.state for e in await cp.jobs.events(job.id)]
            assert events == ["queued", "scheduled"]
            got = await cp.workers.acquire(r.worker_id, 0)
            assert [a.job_id for a in got.assignments] == [job.id]
            assert (await cp.jobs.get(job.id)).state == "running"

    run(body())


def test_a_job_submitted_behind_a_queued_one_does_not_jump_the_queue(world):
    async def body():
        async with world() as (cp, _):
            r = await cp.workers.register(reg("box", slots=1))
            first = await cp.jobs.submit(spec(), "u")
            second = await cp.jobs.submit(spec(), "u")
            third = await cp.jobs.submit(spec(), "u")
            assert [j.state for j in (first, second, third)] == ["scheduled", "queued", "queued"]
            got = await cp.workers.acquire(r.worker_id, 0)
            done = TaskCompletion(state="succeeded", exit_code=0)
            await cp.tasks.complete(as_worker(r), got.assignments[0].task_id, done)
            assert (await cp.jobs.get(second.id)).state == "scheduled"
            assert (await cp.jobs.get(third.id)).state == "queued"

    run(body())


async def _a_call_someone_waits_for(cp):
    """A worker, a call it runs, its assignment, and a caller waiting for its end."""
    r = await cp.workers.register(reg("box"))
    job = await cp.jobs.submit(call_spec(), "u")
    task = (await cp.workers.acquire(r.worker_id, 0)).assignments[0]
    waiter = asyncio.ensure_future(cp.jobs.wait(job.id, 5))
    await asyncio.sleep(0)  # the waiter is waiting (one turn, no time)
    return r, job, task, waiter


def test_a_waiting_caller_has_the_result_while_the_completion_commits(world):
    async def body():
        async with world() as (cp, _):
            r, job, task, waiter = await _a_call_someone_waits_for(cp)
            held, release = asyncio.Event(), asyncio.Event()
            apply = cp.store.apply

            async def slow_commit(stmts):  # the completion's commit waits for the test
                held.set()
                await release.wait()
                await apply(stmts)

            cp.store.apply = slow_commit  # type: ignore[method-assign]
            done = TaskCompletion(state="succeeded", exit_code=0, result=b"forty-two")
            completing = asyncio.ensure_future(cp.tasks.complete(as_worker(r), task.task_id, done))
            await held.wait()
            early = await asyncio.wait_for(waiter, 5)  # answered, the commit still held
            assert not completing.done()
            assert (await cp.store.get_job(job.id)).state == "running"  # not durable yet
            release.set()
            await completing
            cp.store.apply = apply  # type: ignore[method-assign]
            stored = await cp.jobs.get(job.id)
            assert early.state == "succeeded" and early.result == b"forty-two"
            assert early.model_dump() == stored.model_dump()  # what the store says now

    run(body())


def test_a_waiting_caller_is_answered_before_the_completion_commits(world):
    # Not held this time: the commit runs as soon as it can, and still after the
    # woken caller's answer (docs/adr/0139: the caller's wake-up is ready first).
    async def body():
        async with world() as (cp, _):
            r, _, task, waiter = await _a_call_someone_waits_for(cp)
            commit_here = cp.store._commit_here
            answered_first: list[bool] = []

            def commit(units):
                answered_first.append(waiter.done())
                return commit_here(units)

            cp.store._commit_here = commit  # type: ignore[method-assign]
            done = TaskCompletion(state="succeeded", exit_code=0, result=b"forty-two")
            await cp.tasks.complete(as_worker(r), task.task_id, done)
            cp.store._commit_here = commit_here  # type: ignore[method-assign]
            assert answered_first[:1] == [True]
            assert (await waiter).result == b"forty-two"

    run(body())


def test_a_failed_attempt_with_retries_left_is_not_answered_as_the_end(world):
    async def body():
        async with world() as (cp, _):
            r = await cp.workers.register(reg("box"))
            job = await cp.jobs.submit(call_spec(retries=1), "u")
            task = (await cp.workers.acquire(r.worker_id, 0)).assignments[0]
            waiter = asyncio.ensure_future(cp.jobs.wait(job.id, 0.3))
            failed = TaskCompletion(state="failed", exit_code=1, reason="crashed")
            await cp.tasks.complete(as_worker(r), task.task_id, failed)
            assert await waiter is None  # it is queued again, not ended
            assert (await cp.jobs.get(job.id)).state in ("queued", "scheduled")

    run(body())


def test_a_cells_follower_has_its_lines_while_their_batch_commits(world):
    async def body():
        async with world() as (cp, _):
            r = await cp.workers.register(reg("box"))
            session = JobSpec(kind="session", session={"name": "s"})
            await cp.jobs.submit(session, "u")
            await cp.workers.acquire(r.worker_id, 0)  # the session's kernel runs
            waiting = asyncio.ensure_future(cp.workers.acquire(r.worker_id, 5))
            await asyncio.sleep(0)
            cell = await cp.jobs.submit(
                JobSpec(kind="cell", cell={"source": "print(1)", "session": "s"}), "u"
            )
            task = (await asyncio.wait_for(waiting, 5)).assignments[0]
            assert cell.state == "running" and task.job_id == cell.id
            follower = asyncio.ensure_future(cp.jobs.logs(cell.id, 0, 100, 5))
            await asyncio.sleep(0)
            held, release = asyncio.Event(), asyncio.Event()
            append = cp.store.append_logs

            async def slow_commit(*args, **kw):  # the batch's commit waits for the test
                held.set()
                await release.wait()
                return await append(*args, **kw)

            cp.store.append_logs = slow_commit  # type: ignore[method-assign]
            now = datetime.now(UTC)
            lines = [LogEntry(stream="iopub", ts=now, text=t) for t in ('{"a": 1}', '{"b": 2}')]
            shipping = asyncio.ensure_future(
                cp.tasks.append_logs(as_worker(r), task.task_id, LogBatch(seq=0, lines=lines))
            )
            await held.wait()
            early = await asyncio.wait_for(follower, 5)  # answered, the commit still held
            assert not shipping.done()
            assert (await cp.store.log_page(cell.id, 0, 100)).lines == []  # not durable yet
            release.set()
            assert (await shipping).next_seq == 2
            cp.store.append_logs = append  # type: ignore[method-assign]
            stored = await cp.store.log_page(cell.id, 0, 100)
            assert [line.text for line in early.lines] == ['{"a": 1}', '{"b": 2}']
            assert early.lines == stored.lines  # offsets, times, texts: as stored
            assert early.next_offset == stored.next_offset == 2

    run(body())


def test_a_cells_last_lines_and_its_end_are_stored_in_one_commit_and_answered_before_it(world):
    async def body():
        async with world() as (cp, _):
            r = await cp.workers.register(reg("box"))
            await cp.jobs.submit(JobSpec(kind="session", session={"name": "s"}), "u")
            await cp.workers.acquire(r.worker_id, 0)  # the session's kernel runs
            cell = await cp.jobs.submit(
                JobSpec(kind="cell", cell={"source": "print(1)", "session": "s"}), "u"
            )
            task = (await cp.workers.acquire(r.worker_id, 0)).assignments[0]
            follower = asyncio.ensure_future(cp.jobs.logs(cell.id, 0, 100, 5))
            waiter = asyncio.ensure_future(cp.jobs.wait(cell.id, 5))
            await asyncio.sleep(0)
            commits, held, release = [], asyncio.Event(), asyncio.Event()
            commit = cp.store._commit

            async def slow_commit(unit, **kw):  # every commit waits for the test
                commits.append(unit)
                held.set()
                await release.wait()
                return await commit(unit, **kw)

            cp.store._commit = slow_commit  # type: ignore[method-assign]
            now = datetime.now(UTC)
            lines = [LogEntry(stream="iopub", ts=now, text=t) for t in ('{"a": 1}', '{"r": 2}')]
            done = TaskCompletion(state="succeeded", exit_code=0, logs=LogBatch(seq=0, lines=lines))
            completing = asyncio.ensure_future(cp.tasks.complete(as_worker(r), task.task_id, done))
            await held.wait()
            early_lines = await asyncio.wait_for(follower, 5)  # both answered, commit held
            early_end = await asyncio.wait_for(waiter, 5)
            assert [line.text for line in early_lines.lines] == ['{"a": 1}', '{"r": 2}']
            assert early_end.state == "succeeded"
            assert (await cp.store.log_page(cell.id, 0, 100)).lines == []  # nothing stored yet
            assert (await cp.store.get_job(cell.id)).state == "running"
            release.set()
            await completing
            cp.store._commit = commit  # type: ignore[method-assign]
            assert len(commits) == 1  # the lines and the end: one transaction
            stored = await cp.store.log_page(cell.id, 0, 100)
            assert early_lines.lines == stored.lines and stored.complete
            assert (await cp.jobs.get(cell.id)).state == "succeeded"

    run(body())
