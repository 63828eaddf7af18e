"""``queue_timeout``: a job nobody starts in time ends ``timed_out`` and says why it
waited (a real SQLite file, an injected clock, the real sweep)."""

import asyncio
import functools

import pytest

from gpulayer.contracts import JobSpec, JobState, WorkerRegistration
from jupyter_ext.auth import Principal

from .planes import plane_on


@pytest.fixture
def plane(tmp_path):
    return functools.partial(plane_on, tmp_path, heartbeat_seconds=1000.0, lease_seconds=10_000.0)


def reg(name: str, gpus: int = 0, slots: int = 2) -> WorkerRegistration:
    devices = [
        {"index": i, "kind": "cuda", "name": "A100", "memory_bytes": 80 << 30, "simulated": True}
        for i in range(gpus)
    ]
    return WorkerRegistration(name=name, hostname=name, cpus=4, memory_bytes=16 << 30,
                              devices=devices, slots=slots, version="t")  # fmt: skip


def spec(**kw: object) -> JobSpec:
    return JobSpec(command=["true"], **kw)


def test_an_unsatisfiable_job_ends_timed_out_naming_why_it_waited(plane) -> None:
    async def body() -> None:
        async with plane() as (cp, clock):
            await cp.workers.register(reg("box"))
            job = await cp.jobs.submit(spec(resources={"gpus": 1}, queue_timeout="10m"), "ada")
            clock.now += 599
            await cp.leases.sweep()
            assert (await cp.jobs.get(job.id)).state == JobState.queued
            clock.now += 2
            await cp.leases.sweep()
            ended = await cp.jobs.get(job.id)
            assert ended.state == JobState.timed_out
            assert ended.reason == (
                "still queued after 10m00s: unsatisfiable: no registered worker could ever"
                " run this job; box: needs 1 × GPU, has no GPUs"
            )
            assert ended.ended_at is not None and ended.started_at is None
            events = await cp.jobs.events(job.id)
            assert [e.state for e in events] == ["queued", "timed_out"]

    asyncio.run(body())


def test_a_job_without_a_queue_timeout_waits_for_as_long_as_it_takes(plane) -> None:
    async def body() -> None:
        async with plane() as (cp, clock):
            await cp.workers.register(reg("box"))
            job = await cp.jobs.submit(spec(resources={"gpus": 1}), "ada")
            clock.now += 10 * 86400
            await cp.leases.sweep()
            assert (await cp.jobs.get(job.id)).state == JobState.queued

    asyncio.run(body())


def test_the_reason_does_not_name_another_owners_job(plane) -> None:
    async def body() -> None:
        async with plane() as (cp, clock):
            await cp.workers.register(reg("box", gpus=1))
            other = await cp.jobs.submit(spec(resources={"gpus": 1}), "bob")
            mine = await cp.jobs.submit(spec(resources={"gpus": 1}, queue_timeout=30), "ada")
            clock.now += 31
            await cp.leases.sweep()
            ended = await cp.jobs.get(mine.id)
            assert ended.state == JobState.timed_out
            assert ended.reason is not None and "GPU 0 busy" in ended.reason
            assert other.id[:6] not in ended.reason
            assert (await cp.jobs.get(other.id)).state == JobState.scheduled

    asyncio.run(body())


def test_a_placed_job_does_not_time_out_in_the_queue(plane) -> None:
    async def body() -> None:
        async with plane() as (cp, clock):
            await cp.workers.register(reg("box"))
            job = await cp.jobs.submit(spec(queue_timeout=5), "ada")
            clock.now += 60
            await cp.leases.sweep()
            assert (await cp.jobs.get(job.id)).state == JobState.scheduled

    asyncio.run(body())


def test_the_submit_answer_names_only_the_submitters_own_jobs(plane) -> None:
    """The answer to a submit (and to a cancel) says why the job waits as its submitter
    may read it: another owner's job holding the GPU is not named."""

    async def body() -> None:
        async with plane() as (cp, _):
            await cp.workers.register(reg("box", gpus=1))
            other = await cp.jobs.submit(spec(resources={"gpus": 1}), "bob")
            ada = Principal(name="ada", role="submitter")
            mine = await cp.jobs.submit(spec(resources={"gpus": 1}), "ada", ada)
            assert mine.pending_reasons == ["box: needs 1 × GPU, has 0 free (GPU 0 busy)"]
            cancelled = await cp.jobs.cancel(mine.id, by="ada", viewer=ada)
            assert cancelled.state == JobState.cancelled
            assert other.id[:6] not in " ".join(mine.pending_reasons)

    asyncio.run(body())


def test_the_state_machine_lets_a_queued_job_time_out_but_not_fail() -> None:
    from gpulayer.errors import InvalidTransition
    from jupyter_ext import transitions

    transitions.check(JobState.queued, JobState.timed_out, "job", "j")
    for never in (JobState.failed, JobState.succeeded, JobState.lost, JobState.running):
        with pytest.raises(InvalidTransition):
            transitions.check(JobState.queued, never, "job", "j")
