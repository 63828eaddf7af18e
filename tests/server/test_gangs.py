"""Gang placement and ends on a real SQLite file with an injected clock."""

from datetime import UTC, datetime

from gpulayer.contracts import JobSpec, LogBatch, LogEntry, MetricBatch, MetricPoint, TaskCompletion

from . import test_scheduler
from .test_scheduler import as_worker, reg, run

world = test_scheduler.world  # the scheduler fixture, shared


def gang(nodes=2, **kw):
    return JobSpec(kind="distributed", command=["python", "train.py"], nodes=nodes, **kw)


def done(state, **kw):
    return TaskCompletion(state=state, **kw)


def test_a_gang_with_only_one_fitting_worker_waits_and_holds_nothing(world):
    async def body():
        async with world() as (sched, _):
            a = await sched.workers.register(reg("a", gpus=1))
            await sched.workers.register(reg("b"))  # no GPU: can never run a node
            job = await sched.jobs.submit(gang(resources={"gpus": 1}), "u")
            assert job.state == "queued"
            assert job.tasks == []
            assert "a: fits" in job.pending_reasons[0]
            assert job.pending_reasons[1].startswith("b: needs 1 × GPU")
            placement = await sched.jobs.placement(job.id)
            assert not placement.satisfiable
            assert "needs 2 workers" in placement.summary
            # Nothing is held: a single-GPU job takes worker a's GPU at once.
            single = await sched.jobs.submit(JobSpec(command=["true"], resources={"gpus": 1}), "u")
            assert single.state == "scheduled"
            got = await sched.workers.acquire(a.worker_id, 0)
            assert [x.job_id for x in got.assignments] == [single.id]

    run(body())


def test_a_gang_waits_for_a_busy_worker_then_places_every_node_at_once(world):
    async def body():
        async with world() as (sched, _):
            a = await sched.workers.register(reg("a", slots=1))
            b = await sched.workers.register(reg("b", slots=1))
            blocker = await sched.jobs.submit(JobSpec(command=["true"]), "u")
            job = await sched.jobs.submit(gang(), "u")
            assert job.state == "queued"
            assert "1 of 2 workers fit now" in (await sched.jobs.placement(job.id)).summary
            first = await sched.workers.acquire(a.worker_id, 0) or await sched.workers.acquire(
                b.worker_id, 0
            )
            (blocked,) = first.assignments
            assert blocked.job_id == blocker.id
            await sched.tasks.complete(
                as_worker(a), blocked.task_id, done("succeeded", exit_code=0)
            )
            placed = await sched.jobs.get(job.id)
            assert placed.state == "scheduled"
            assert sorted(t.node_rank for t in placed.tasks) == [0, 1]
            assert len({t.worker_id for t in placed.tasks}) == 2
            ga = (await sched.workers.acquire(a.worker_id, 0)).assignments[0].gang
            gb = (await sched.workers.acquire(b.worker_id, 0)).assignments[0].gang
            assert {ga.node_rank, gb.node_rank} == {0, 1}
            assert (ga.master_addr, ga.master_port) == (gb.master_addr, gb.master_port)
            assert ga.nnodes == 2 and ga.world_size == 2

    run(body())


def test_one_failed_node_fails_the_gang_and_frees_every_slot(world):
    async def body():
        async with world() as (sched, _):
            ra = await sched.workers.register(reg("a", slots=1))
            rb = await sched.workers.register(reg("b", slots=1))
            job = await sched.jobs.submit(gang(), "u")
            ta = (await sched.workers.acquire(ra.worker_id, 0)).assignments[0]
            tb = (await sched.workers.acquire(rb.worker_id, 0)).assignments[0]
            assert (await sched.jobs.get(job.id)).state == "running"
            await sched.tasks.complete(
                as_worker(rb), tb.task_id, done("failed", exit_code=1, reason="rank 1: boom")
            )
            ended = await sched.jobs.get(job.id)
            assert ended.state == "failed"
            assert ended.reason == f"node {tb.gang.node_rank} on b: rank 1: boom"
            states = {t.id: t.state for t in ended.tasks}
            assert states == {ta.task_id: "cancelled", tb.task_id: "failed"}
            # Worker a hears of the stop at once, and both slots are free again.
            stop = await sched.workers.acquire(ra.worker_id, 0)
            assert stop.cancel == [ta.task_id]
            nxt = await sched.jobs.submit(gang(), "u")
            assert nxt.state == "scheduled"
            # The stopped node's own report changes nothing.
            await sched.tasks.complete(as_worker(ra), ta.task_id, done("cancelled"))
            assert (await sched.jobs.get(job.id)).reason == ended.reason

    run(body())


def test_a_gang_succeeds_once_every_node_did_and_cancel_stops_all(world):
    async def body():
        async with world() as (sched, _):
            ra = await sched.workers.register(reg("a"))
            await sched.workers.register(reg("b"))
            job = await sched.jobs.submit(gang(resources={"worker": "a"}), "u")  # pinned: shares a
            tasks = (await sched.workers.acquire(ra.worker_id, 0)).assignments
            assert sorted(t.gang.node_rank for t in tasks) == [0, 1]
            await sched.tasks.complete(
                as_worker(ra), tasks[0].task_id, done("succeeded", exit_code=0)
            )
            assert (await sched.jobs.get(job.id)).state == "running"
            await sched.tasks.complete(
                as_worker(ra), tasks[1].task_id, done("succeeded", exit_code=0)
            )
            assert (await sched.jobs.get(job.id)).state == "succeeded"

            other = await sched.jobs.submit(gang(), "u")
            cancelled = await sched.jobs.cancel(other.id, "ada")
            assert cancelled.state == "cancelled"
            assert {t.state for t in cancelled.tasks} == {"cancelled"}

    run(body())


def test_ranked_logs_and_metrics_are_stored_in_order(world):
    async def body():
        async with world() as (sched, _):
            r = await sched.workers.register(reg("a"))
            job = await sched.jobs.submit(JobSpec(command=["true"]), "u")
            (t,) = (await sched.workers.acquire(r.worker_id, 0)).assignments
            now = datetime.now(UTC)
            line = LogEntry(stream="stdout", ts=now, text="hi", rank=3)
            await sched.tasks.append_logs(as_worker(r), t.task_id, LogBatch(seq=0, lines=[line]))
            page = await sched.jobs.logs(job.id, 0, 10, 0)
            assert [(x.text, x.rank) for x in page.lines] == [("hi", 3)]

            metrics = sched.training_metrics
            pts = [MetricPoint(step=i, ts=now, metrics={"train/loss": 1 / i}) for i in (1, 2, 3)]
            await metrics.append(as_worker(r), t.task_id, MetricBatch(seq=0, points=pts[:2]))
            ack = await metrics.append(as_worker(r), t.task_id, MetricBatch(seq=1, points=pts[1:]))
            assert ack.next_seq == 3  # the resent point is stored once
            got = await metrics.page(job.id, 0, 100, 0)
            assert [p.step for p in got.points] == [1, 2, 3]
            assert [p.seq for p in got.points] == [1, 2, 3]
            assert (await metrics.page(job.id, got.next_after, 100, 0)).points == []

    run(body())
