"""Logs per attempt: ``attempt=`` pages, and the gap a dead worker's undelivered
lines leave (on the services with an injected clock; tests/integration/
test_attempts.py runs the same with real workers)."""

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
from jupyter_ext.auth import Principal
from jupyter_ext.control_plane import ControlPlane

from .planes import Clock, plane_on


@pytest.fixture
def plane(tmp_path):
    return functools.partial(plane_on, tmp_path, heartbeat_seconds=1.0, lease_seconds=10.0)


def reg(name: str) -> WorkerRegistration:
    return WorkerRegistration(name=name, hostname=name, cpus=4, memory_bytes=16 << 30,
                              slots=1, version="t")  # fmt: skip


async def ship(cp: ControlPlane, worker_id: str, task_id: str, seq: int, *texts: str) -> None:
    lines = [LogEntry(stream="stdout", ts=datetime.now(UTC), text=t) for t in texts]
    who = Principal(name="w", role="worker", worker_id=worker_id)
    await cp.tasks.append_logs(who, task_id, LogBatch(seq=seq, lines=lines))


async def lose(cp: ControlPlane, clock: Clock, worker_id: str, task_id: str, produced: int):
    """The worker's last heartbeat says ``produced`` lines; then it goes silent."""
    await cp.workers.heartbeat(
        worker_id, Heartbeat(running_tasks=[task_id], log_lines={task_id: produced})
    )
    clock.now += 11  # past the lease
    await cp.leases.sweep()


async def test_a_dead_workers_undelivered_lines_are_a_recorded_gap(plane):
    async with plane() as (cp, clock):
        one = await cp.workers.register(reg("one"))
        job = await cp.jobs.submit(JobSpec(command=["true"], retries=1), "u")
        first = (await cp.workers.acquire(one.worker_id, 0)).assignments[0]
        await ship(cp, one.worker_id, first.task_id, 0, "a", "b")
        await lose(cp, clock, one.worker_id, first.task_id, produced=5)

        two = await cp.workers.register(reg("two"))
        second = (await cp.workers.acquire(two.worker_id, 0)).assignments[0]
        await ship(cp, two.worker_id, second.task_id, 0, "c")

        page = await cp.jobs.logs(job.id, 0, 100, 0)
        assert [ln.text for ln in page.lines] == [
            "a", "b",
            "── 3 lines of attempt 1 lost when one died (produced, never delivered)",
            "c",
        ]  # fmt: skip
        gap = page.lines[2]
        assert gap.stream == "system" and gap.task_id == first.task_id

        one_page = await cp.jobs.logs(job.id, 0, 100, 0, attempt=1)
        assert [ln.text for ln in one_page.lines] == [ln.text for ln in page.lines[:3]]
        two_page = await cp.jobs.logs(job.id, 0, 100, 0, attempt=2)
        assert [(ln.offset, ln.text) for ln in two_page.lines] == [(3, "c")]
        assert two_page.next_offset == 4 and not two_page.complete


async def test_a_given_up_task_whose_lines_all_arrived_still_says_it_was_cut_off(plane):
    """Its last heartbeat counted every line as stored, but lines printed after that
    heartbeat died with the worker: the log says they may be missing, never silent."""
    async with plane() as (cp, clock):
        one = await cp.workers.register(reg("one"))
        job = await cp.jobs.submit(JobSpec(command=["true"]), "u")
        task = (await cp.workers.acquire(one.worker_id, 0)).assignments[0]
        await ship(cp, one.worker_id, task.task_id, 0, "a", "b")
        await lose(cp, clock, one.worker_id, task.task_id, produced=2)
        page = await cp.jobs.logs(job.id, 0, 100, 0)
        assert [ln.text for ln in page.lines] == [
            "a", "b",
            "── attempt 1 lost when one died: lines it printed after the last one above"
            " may be missing",
        ] and page.complete  # fmt: skip


async def test_a_task_its_worker_reports_lost_has_no_gap(plane):
    """A worker that stops cleanly flushes a task's lines before it reports it lost."""
    async with plane() as (cp, _clock):
        one = await cp.workers.register(reg("one"))
        job = await cp.jobs.submit(JobSpec(command=["true"]), "u")
        task = (await cp.workers.acquire(one.worker_id, 0)).assignments[0]
        await ship(cp, one.worker_id, task.task_id, 0, "a", "b")
        who = Principal(name="w", role="worker", worker_id=one.worker_id)
        done = TaskCompletion(state="lost", reason="worker shutting down")
        await cp.tasks.complete(who, task.task_id, done)
        page = await cp.jobs.logs(job.id, 0, 100, 0)
        assert [ln.text for ln in page.lines] == ["a", "b"] and page.complete


async def test_attempt_pages_walk_past_the_other_attempts_lines(plane):
    async with plane() as (cp, clock):
        one = await cp.workers.register(reg("one"))
        job = await cp.jobs.submit(JobSpec(command=["true"], retries=1), "u")
        first = (await cp.workers.acquire(one.worker_id, 0)).assignments[0]
        await ship(cp, one.worker_id, first.task_id, 0, *[f"one {i}" for i in range(5)])
        await lose(cp, clock, one.worker_id, first.task_id, produced=5)
        two = await cp.workers.register(reg("two"))
        second = (await cp.workers.acquire(two.worker_id, 0)).assignments[0]
        await ship(cp, two.worker_id, second.task_id, 0, *[f"two {i}" for i in range(3)])

        seen, offset = [], 0
        while True:  # two lines a page, as a client pages
            page = await cp.jobs.logs(job.id, offset, 2, 0, attempt=2)
            seen += [ln.text for ln in page.lines]
            if not page.lines:
                break
            offset = page.next_offset
        assert seen == ["two 0", "two 1", "two 2"]
        first_page = await cp.jobs.logs(job.id, 0, 2, 0, attempt=1)
        assert [ln.text for ln in first_page.lines] == ["one 0", "one 1"]
        assert first_page.next_offset == 2
