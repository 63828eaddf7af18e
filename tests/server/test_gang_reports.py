"""``explain`` of a distributed job names every node's worker (a pure report)."""

from datetime import UTC, datetime

from gpulayer.contracts import Job
from jupyter_ext.placement import placed_report

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def gang(state: str, attempts: int = 2) -> Job:
    tasks = [
        {"id": f"a{n}", "job_id": "j", "attempt": 1, "state": "lost", "node_rank": n,
         "worker_name": "old", "created_at": NOW}
        for n in (0, 1)
    ] + [
        {"id": f"b{n}", "job_id": "j", "attempt": 2, "state": state, "node_rank": n,
         "worker_name": f"local-{n + 1}", "gpu_indices": [0, 1], "created_at": NOW}
        for n in (1, 0)
    ]  # fmt: skip
    return Job.model_validate({
        "id": "j", "state": state, "owner": "ada", "attempts": attempts, "created_at": NOW,
        "updated_at": NOW, "worker_name": "local-1", "tasks": tasks,
        "spec": {"kind": "distributed", "nodes": 2, "command": ["true"]},
    })  # fmt: skip


def test_every_node_of_the_latest_attempt_is_named() -> None:
    assert placed_report(gang("succeeded")).summary == (
        "ran on local-1 (node 0, GPUs 0,1), local-2 (node 1, GPUs 0,1)"
    )
    assert placed_report(gang("running")).summary.startswith("running on local-1 (node 0")


def test_a_single_task_job_reads_as_before() -> None:
    one = Job.model_validate({
        "id": "j", "state": "running", "owner": "ada", "attempts": 1, "created_at": NOW,
        "updated_at": NOW, "worker_name": "local-1", "spec": {"command": ["true"]},
        "tasks": [{"id": "t", "job_id": "j", "attempt": 1, "state": "running",
                   "worker_name": "local-1", "gpu_indices": [1], "created_at": NOW}],
    })  # fmt: skip
    assert placed_report(one).summary == "running on local-1 (GPUs 1)"
