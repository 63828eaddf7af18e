"""The state machine in ``transitions.py``: the only writer of job and task states."""

import pytest

from gpulayer.contracts import TERMINAL_STATES, JobState
from gpulayer.errors import InvalidTransition
from jupyter_ext import transitions
from jupyter_ext.store import TaskRecord


def task(state: JobState) -> TaskRecord:
    return TaskRecord(
        id="t1", job_id="j1", attempt=1, state=state, worker_id="w1", gpu_indices=(),
        exit_code=None, reason=None, created_at=0.0, started_at=None, ended_at=None,
        lease_expires=None, cancel_requested=False, log_seq=0, node_rank=None,
        gang_json=None, metric_seq=0,
    )  # fmt: skip


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_terminal_states_allow_no_move(state):
    for new in JobState:
        with pytest.raises(InvalidTransition, match=f"job j1 cannot go from {state} to {new}"):
            transitions.check(state, new, "job", "j1")


def test_only_a_running_task_ends_and_only_a_scheduled_one_starts():
    with pytest.raises(InvalidTransition):
        transitions.task_end(1.0, task(JobState.queued), JobState.succeeded, 0, None)
    with pytest.raises(InvalidTransition):
        transitions.task_end(1.0, task(JobState.succeeded), JobState.failed, 1, None)
    assert transitions.task_end(1.0, task(JobState.running), JobState.succeeded, 0, None)
    # Starting checks the task before anything else: an ended task cannot start again.
    with pytest.raises(InvalidTransition, match="task t1 cannot go from lost to running"):
        transitions.started(1.0, None, task(JobState.lost), 2.0)  # type: ignore[arg-type]
