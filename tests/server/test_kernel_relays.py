"""Kernel relays on the services with an injected clock (jupyter_ext/kernel_relays.py):
frames pass between the two sides as they are, a new client replaces the old one,
the detach grace ends a kernel nobody attached to, and a busy kernel is never idle.
tests/integration/test_kernels.py runs the same through real sockets."""

import functools

import pytest

from gpulayer.contracts import (
    CLOSE_KERNEL_ENDED,
    CLOSE_REPLACED,
    KERNEL_READY,
    JobSpec,
    TaskCompletion,
    WorkerRegistration,
)
from gpulayer.errors import Forbidden, NotFound
from jupyter_ext.auth import Principal
from jupyter_ext.control_plane import ControlPlane

from .planes import plane_on


class Peer:
    """One side of a relay, as a WebSocket handler is to the relays."""

    def __init__(self) -> None:
        self.got: list[bytes | str] = []
        self.closed: tuple[int, str] | None = None

    def relay(self, frame: bytes | str) -> None:
        self.got.append(frame)

    def close_relay(self, code: int, why: str) -> None:
        self.closed = (code, why)


@pytest.fixture
def plane(tmp_path):
    return functools.partial(plane_on, tmp_path, heartbeat_seconds=1.0, lease_seconds=600.0,
                             kernel_detach_seconds=120.0, session_idle_seconds=3600.0)  # fmt: skip


def kernel_spec(name: str = "kernel-1", idle: float | None = None) -> JobSpec:
    session = {"name": name, "relay": True, "idle_timeout": idle}
    return JobSpec.model_validate({"kind": "session", "name": name, "session": session})


async def running_kernel(cp: ControlPlane, owner: str = "ada", **kw) -> tuple[str, Principal]:
    """A relay session of ``owner`` placed and started on a new worker; its job id and
    the worker's principal."""
    reg = await cp.workers.register(
        WorkerRegistration(
            name="w", hostname="w", cpus=4, memory_bytes=1 << 34, slots=2, version="t"
        )
    )
    job = await cp.jobs.submit(kernel_spec(**kw), owner)
    (a,) = (await cp.workers.acquire(reg.worker_id, 0)).assignments
    assert a.job_id == job.id
    return job.id, Principal(name="w", role="worker", worker_id=reg.worker_id)


async def test_frames_pass_between_the_sides_and_a_new_client_replaces_the_old(plane):
    async with plane() as (cp, _):
        job_id, worker = await running_kernel(cp)
        relays = cp.kernel_relays
        ada = Principal(name="ada", role="submitter")
        await relays.admit_client(job_id, ada)
        first, kernel = Peer(), Peer()
        relays.attach_client(job_id, first)
        relays.from_client(job_id, b"dropped: no kernel side yet")
        await relays.admit_worker(worker.worker_id or "", job_id, worker)
        relays.attach_worker(job_id, kernel)
        assert first.got == [KERNEL_READY] and kernel.got == []
        relays.from_client(job_id, b"execute")
        relays.from_worker(job_id, b"reply")
        assert kernel.got == [b"execute"] and first.got[-1] == b"reply"

        second = Peer()
        relays.attach_client(job_id, second)
        assert first.closed is not None and first.closed[0] == CLOSE_REPLACED
        assert second.got == [KERNEL_READY]

        # Nobody else attaches: another owner, a non-worker, another worker.
        with pytest.raises(NotFound):
            await relays.admit_client(job_id, Principal(name="bob", role="submitter"))
        with pytest.raises(Forbidden):
            await relays.admit_worker(worker.worker_id or "", job_id, Principal("root", "admin"))
        with pytest.raises(Forbidden):
            other = Principal(name="w2", role="worker", worker_id="w2")
            await relays.admit_worker(worker.worker_id or "", job_id, other)


async def test_the_detach_grace_ends_a_kernel_nobody_attached_to(plane):
    async with plane() as (cp, clock):
        job_id, _ = await running_kernel(cp)
        relays = cp.kernel_relays
        await relays.admit_client(job_id, Principal(name="ada", role="submitter"))
        client = Peer()
        relays.attach_client(job_id, client)
        clock.now += 1000
        assert await relays.sweep() == []  # attached: kept however long
        relays.detach(job_id, client)
        clock.now += 100
        assert await relays.sweep() == []  # within the grace
        clock.now += 21
        assert await relays.sweep() == [job_id]
        events = await cp.jobs.events(job_id)
        assert any("no Jupyter client attached for 120s" in (e.reason or "") for e in events)
        assert await relays.sweep() == []  # asked once


async def test_a_busy_kernel_is_never_idle_and_its_end_closes_both_sides(plane):
    async with plane() as (cp, clock):
        job_id, worker = await running_kernel(cp, idle=60.0)
        relays = cp.kernel_relays
        await relays.admit_client(job_id, Principal(name="ada", role="submitter"))
        await relays.admit_worker(worker.worker_id or "", job_id, worker)
        client, kernel = Peer(), Peer()
        relays.attach_client(job_id, client)
        relays.attach_worker(job_id, kernel)
        relays.state(job_id, "busy")  # a cell that runs for hours
        clock.now += 600
        assert await cp.sessions.idle(clock.now) == []
        relays.state(job_id, "idle")
        clock.now += 61
        ((idle_job, why),) = await cp.sessions.idle(clock.now)
        assert idle_job == job_id and why == "ended after 1m without use"

        await cp.jobs.cancel(job_id, by="ada")
        (task,) = await cp.store.tasks_of_job(job_id)
        done = TaskCompletion(state="succeeded", exit_code=0, reason="kernel ended")
        await cp.tasks.complete(worker, task.id, done)
        await relays.ended(job_id)
        for side in (client, kernel):
            assert side.closed is not None and side.closed[0] == CLOSE_KERNEL_ENDED
