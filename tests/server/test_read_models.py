"""What placement reads, followed in memory (``store/changes.py``): after every
commit the active tasks' holds are what the file says (placement, start, end, a
lease that runs out and its retry, a cancel, a rolled-back transaction, a restart),
the fleet's views are read again exactly when a worker changed, and a cell's
submit reads its sessions by id."""

import json

import pytest

from gpulayer.contracts import CreateSession, Heartbeat, JobSpec, JobState, TaskCompletion
from gpulayer.errors import Conflict
from jupyter_ext import transitions
from jupyter_ext.store import Store

from .planes import plane_on
from .test_scheduler import as_worker, reg, run, spec

Held = dict[str, tuple[str, str | None, tuple[int, ...], bool]]


async def in_file(store: Store) -> Held:
    rows = await store._all(
        "SELECT id, job_id, worker_id, gpu_indices, state FROM tasks"
        " WHERE state IN ('scheduled', 'running')"
    )
    return {
        r["id"]: (
            r["job_id"], r["worker_id"], tuple(json.loads(r["gpu_indices"])),
            r["state"] == "scheduled",
        )
        for r in rows
    }  # fmt: skip


def in_memory(store: Store) -> Held:
    holds = store.active_holds
    got = {t: (h.job_id, h.worker_id, h.gpu_indices, h.scheduled) for t, h in holds.by_task.items()}
    # What a worker's acquire asks of it agrees with the holds.
    for t, (_, worker_id, _, scheduled) in got.items():
        assert holds.running(t) is not scheduled
        if scheduled and worker_id is not None:
            assert holds.any_scheduled(worker_id)
    for worker_id in {w for _, w, _, _ in got.values() if w is not None}:
        waiting = any(s for _, w, _, s in got.values() if w == worker_id)
        assert holds.any_scheduled(worker_id) is waiting
    return got


def test_the_holds_placement_reads_are_the_files_after_every_change(tmp_path):
    async def body():
        async with plane_on(tmp_path, heartbeat_seconds=1.0, lease_seconds=10.0) as (sched, clock):
            store = sched.store

            async def same() -> int:
                assert in_memory(store) == await in_file(store)
                return len(in_memory(store))

            r = await sched.workers.register(reg("box", gpus=2, slots=3))
            a = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")
            b = await sched.jobs.submit(spec(resources={"gpus": 1}, retries=1), "u")
            c = await sched.jobs.submit(spec(), "u")
            q = await sched.jobs.submit(spec(resources={"gpus": 1}), "u")  # no GPU left
            assert await same() == 3  # scheduled
            got = await sched.workers.acquire(r.worker_id, 0)
            assert {x.job_id for x in got.assignments} == {a.id, b.id, c.id}
            assert await same() == 3  # running, the same holds
            assert not store.active_holds.any_scheduled(r.worker_id)
            task = {x.job_id: x.task_id for x in got.assignments}
            done = TaskCompletion(state="succeeded", exit_code=0)
            await sched.tasks.complete(as_worker(r), task[a.id], done)
            assert (await sched.jobs.get(q.id)).state == "scheduled"  # a's GPU went to q
            assert await same() == 3
            await sched.jobs.cancel(c.id, by="u")
            await sched.tasks.complete(
                as_worker(r), task[c.id], TaskCompletion(state="cancelled", exit_code=None)
            )
            assert await same() == 2
            clock.now += 11  # every lease runs out: b is retried, q placed again
            await sched.leases.sweep()
            states = [(await sched.jobs.get(j.id)).state for j in (b, q)]
            assert await same() == states.count("scheduled")
        # A restart reads the holds from the file.
        async with plane_on(tmp_path) as (sched, _):
            store = sched.store
            assert in_memory(store) == await in_file(store)

    run(body())


def test_a_rolled_back_transaction_changes_no_hold(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            s = spec().model_dump_json()
            await store.apply(transitions.submitted(1.0, "a", s, "ada", 0))
            job = await store.get_job("a")
            placed = transitions.placed_on(2.0, job, "t1", "w1", "w1", [0])
            with pytest.raises(Conflict):  # "a" again: the whole transaction rolls back
                await store.apply(placed + transitions.submitted(2.0, "a", s, "ada", 0))
            assert in_memory(store) == {} == await in_file(store)
            await store.apply(placed)
            assert in_memory(store) == {"t1": ("a", "w1", (0,), True)} == await in_file(store)
            task = await store.get_task("t1")
            await store.apply(transitions.task_end(3.0, task, JobState.lost, None, "gone"))
            assert in_memory(store) == {} == await in_file(store)
        finally:
            await store.close()

    run(body())


def test_the_fleet_placement_sees_is_read_again_only_when_a_worker_changed(tmp_path):
    """Placement's worker views come from memory between changes of a worker's
    registration, name or state, and are what a fresh read says after each."""

    async def body():
        async with plane_on(tmp_path, heartbeat_seconds=1.0, lease_seconds=10.0) as (sched, clock):
            fleet, store = sched.core.fleet, sched.store
            reads = 0
            list_workers = store.list_workers

            async def counted():
                nonlocal reads
                reads += 1
                return await list_workers()

            store.list_workers = counted  # type: ignore[method-assign]

            async def fresh() -> list[tuple[str, str, int]]:
                return [(r.name, r.state, r.info["slots"]) for r in await list_workers()]

            async def seen() -> list[tuple[str, str, int]]:
                return [(v.name, v.state, v.slots) for v in await fleet.views()]

            r = await sched.workers.register(reg("box", slots=2))
            assert await seen() == await fresh() == [("box", "ready", 2)]
            before = reads
            await sched.jobs.submit(spec(), "u")  # placed at once: placement read the fleet
            await sched.workers.heartbeat(r.worker_id, Heartbeat(running_tasks=[]))
            assert await seen() == [("box", "ready", 2)] and reads == before  # no change
            await sched.workers.drain("box")
            assert await seen() == await fresh() == [("box", "draining", 2)]
            await sched.workers.drain("box", draining=False)
            await sched.workers.register(reg("box", slots=5))  # registered again, bigger
            assert await seen() == await fresh() == [("box", "ready", 5)]
            await sched.workers.register(reg("two", slots=1))
            clock.now += 4  # both silent: unhealthy
            await sched.leases.sweep()
            assert await seen() == await fresh() == [("box", "unhealthy", 5),
                                                     ("two", "unhealthy", 1)]  # fmt: skip

    run(body())


def test_a_cell_submit_reads_its_sessions_not_every_job_queued_beside_them(tmp_path):
    """A sweep queued beside a session does not slow its cells: a cell's submit reads
    the sessions by id, whatever else waits (it read every queued and running job's
    spec, 300 here, to find the sessions among them)."""

    async def body():
        async with plane_on(tmp_path, heartbeat_seconds=1.0, lease_seconds=10.0) as (sched, _):
            r = await sched.workers.register(reg("box", slots=2))
            await sched.session_service.create(CreateSession(name="s"), "ada")
            (a,) = (await sched.workers.acquire(r.worker_id, 0)).assignments
            assert a.spec.kind == "session"
            big = spec(resources={"gpus": 8})  # no worker has 8 GPUs: queued for good
            await sched.jobs.submit_many([big] * 300, "bob")
            store = sched.store
            ran: list[str] = []
            for conn in (store._reader, store.db._conn):
                conn.set_trace_callback(ran.append)
            cell = JobSpec(kind="cell", cell={"source": "1", "session": "s"})
            job = await sched.jobs.submit(cell, "ada")
            for conn in (store._reader, store.db._conn):
                conn.set_trace_callback(None)
            assert job.state == "scheduled"  # placed on the session's worker at once
            by_state = [q for q in ran if "FROM jobs WHERE state" in q]
            assert not by_state, by_state

    run(body())
