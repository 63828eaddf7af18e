"""The only writer of job and task states: each change checked, each with its event.

Every change of state is checked against the state machine, then written together
with an ``events`` row (time, state, reason) in the caller's transaction::

    queued ──▶ scheduled ──▶ running ──▶ succeeded | failed | cancelled | timed_out | lost
      ▲            │            │
      └────────────┴────────────┘   retry, or a task taken back before it started

A queued job ends ``cancelled``, or ``timed_out`` when its ``queue_timeout`` runs out
before a worker started it.

The functions here are pure: they take records as read under the control plane's
lock and return :data:`~jupyter_ext.store.Statement` lists for
:meth:`~jupyter_ext.store.Store.apply`. Nothing else builds a statement that
changes a job's or a task's state.
"""

from collections.abc import Callable, Sequence

from gpulayer.contracts import TERMINAL_STATES, JobState, format_duration
from gpulayer.errors import InvalidTransition

from .store import JobRecord, Statement, TaskRecord
from .store import writes as w

_S = JobState

#: Allowed moves of a job or task (terminal states allow none).
ALLOWED: dict[JobState, frozenset[JobState]] = {
    # timed_out: its queue_timeout ran out before any worker started it
    _S.queued: frozenset({_S.scheduled, _S.cancelled, _S.timed_out}),
    _S.scheduled: frozenset({_S.running, _S.queued, _S.cancelled, _S.lost}),
    _S.running: frozenset(
        {_S.succeeded, _S.failed, _S.cancelled, _S.timed_out, _S.lost, _S.queued}
    ),
}
#: States a job or task never leaves (the contracts' one definition).
TERMINAL = TERMINAL_STATES
#: Failures that give a job another attempt while its retries last.
RETRIED = frozenset({_S.failed, _S.lost})


#: The statements that store a job placed at its submit and its task as started at
#: the first argument, its lease running until the second (see :func:`submitted_placed`).
Begin = Callable[[float, float], list[Statement]]


def check(current: JobState, new: JobState, kind: str, item_id: str) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> new`` is allowed for the
    ``kind`` ("job" or "task") ``item_id``."""
    if new not in ALLOWED.get(current, frozenset()):
        raise InvalidTransition(f"{kind} {item_id} cannot go from {current} to {new}")


def note(now: float, job_id: str, task_id: str | None, what: str, reason: str) -> list[Statement]:
    """An event that changes no state (``cancel_requested``, ``interrupt_requested``)."""
    return [w.insert_event(job_id, task_id, now, what, reason)]


def submitted(
    now: float, job_id: str, spec_json: str, owner: str, priority: int
) -> list[Statement]:
    """A new job, ``queued``."""
    return [
        w.insert_job(job_id, spec_json, owner, priority, "waiting for placement", now),
        w.insert_event(job_id, None, now, _S.queued, f"submitted by {owner}"),
    ]


def job_to(
    now: float,
    job: JobRecord,
    state: JobState,
    reason: str | None,
    *,
    started: bool = False,
    exit_code: int | None = None,
) -> list[Statement]:
    """Move ``job`` to ``state`` (nothing when it is there already); a terminal
    state records the end time and ``exit_code``."""
    if job.state == state:
        return []
    check(job.state, state, "job", job.id)
    ended = state in TERMINAL
    change = w.set_job_state(
        job.id, state, reason, now, started=started, ended=ended, exit_code=exit_code
    )
    return [change, w.insert_event(job.id, None, now, state, reason)]


def task_end(
    now: float, task: TaskRecord, state: JobState, exit_code: int | None, reason: str | None
) -> list[Statement]:
    """End ``task`` in ``state``; its own API token (api_access) ends with it."""
    check(task.state, state, "task", task.id)
    return [
        w.set_task_ended(task.id, state, exit_code, reason, now),
        w.insert_event(task.job_id, task.id, now, state, reason),
        w.revoke_task_tokens(task.id, now),
    ]


def placed(
    now: float,
    job: JobRecord,
    tasks: Sequence[tuple[str, str, Sequence[int], int | None, str | None]],
    reason: str,
) -> list[Statement]:
    """Give ``job`` its next attempt: one ``scheduled`` task per
    ``(task_id, worker_id, gpus, node_rank, gang_json)``, the first one's worker as
    the job's."""
    attempt = job.attempts + 1
    stmts = [
        w.insert_task(tid, job.id, attempt, wid, gpus, now, rank, gang)
        for tid, wid, gpus, rank, gang in tasks
    ]
    stmts.append(w.set_job_attempt(job.id, attempt, tasks[0][1]))
    return [*stmts, *job_to(now, job, _S.scheduled, reason)]


def placed_on(
    now: float, job: JobRecord, task_id: str, worker_id: str, worker_name: str, gpus: list[int]
) -> list[Statement]:
    """Give ``job`` one task on one worker (and these GPUs)."""
    why = placed_reason(worker_name, gpus)
    return placed(now, job, [(task_id, worker_id, gpus, None, None)], why)


def submitted_placed(
    now: float,
    job: JobRecord,
    task_id: str,
    worker_id: str,
    worker_name: str,
    gpus: list[int],
    started_at: float | None = None,
    lease_expires: float | None = None,
) -> list[Statement]:
    """A new ``job`` (as :func:`submitted` would store it) placed at once on one
    worker and, with ``started_at``, started there: the rows and events that
    :func:`submitted`, :func:`placed_on` and :func:`started` would leave, in three
    statements rather than twelve (each write of a job's row re-indexes it; a warm
    call waits for this transaction)."""
    check(_S.queued, _S.scheduled, "job", job.id)
    why = placed_reason(worker_name, gpus)
    events: list[tuple[str, str | None, float, str, str | None]] = [
        (job.id, None, now, _S.queued, f"submitted by {job.owner}"),
        (job.id, None, now, _S.scheduled, why),
    ]
    state, reason = _S.scheduled, why
    if started_at is not None:
        check(_S.scheduled, _S.running, "job", job.id)
        state, reason = _S.running, "running"
        events += [(job.id, task_id, started_at, _S.running, "picked up by worker"),
                   (job.id, None, started_at, _S.running, "running")]  # fmt: skip
    return [
        w.insert_job(job.id, job.spec_json, job.owner, job.priority, reason, now,
                     state=state, worker_id=worker_id, started_at=started_at),
        w.insert_task(task_id, job.id, 1, worker_id, gpus, now,
                      state=state, started_at=started_at, lease_expires=lease_expires),
        w.insert_events(events),
    ]  # fmt: skip


def placed_reason(worker_name: str, gpus: Sequence[int]) -> str:
    """Why a job's task was placed: its worker and GPUs."""
    gpu_text = f", GPUs {','.join(map(str, gpus))}" if gpus else ""
    return f"placed on {worker_name}{gpu_text}"


def started(now: float, job: JobRecord, task: TaskRecord, lease_expires: float) -> list[Statement]:
    """A worker picked ``task`` up: it and its job run."""
    check(task.state, _S.running, "task", task.id)
    return [
        w.set_task_running(task.id, now, lease_expires),
        w.insert_event(task.job_id, task.id, now, _S.running, "picked up by worker"),
        *job_to(now, job, _S.running, "running", started=True),
    ]


def unplaced(now: float, job: JobRecord, task: TaskRecord, reason: str) -> list[Statement]:
    """Take back a task nobody started: the job is queued again and the attempt
    does not count."""
    return [
        *task_end(now, task, _S.lost, None, reason),
        w.set_job_attempt(job.id, job.attempts - 1, job.worker_id),
        *job_to(now, job, _S.queued, f"back in the queue: {reason}"),
    ]


def queue_timed_out(now: float, job: JobRecord, limit: float, why: str) -> list[Statement]:
    """End a job still queued after its ``queue_timeout`` (``limit`` seconds) as
    ``timed_out``; ``why`` says why it waited. It never ran, so it is not retried."""
    return job_to(now, job, _S.timed_out, f"still queued after {format_duration(limit)}: {why}")


def cancel_requested(now: float, task: TaskRecord, reason: str) -> list[Statement]:
    """Flag a running task for its worker to cancel."""
    return [
        w.set_cancel_requested(task.id),
        *note(now, task.job_id, task.id, "cancel_requested", reason),
    ]


def retry_or_end(
    now: float,
    job: JobRecord,
    retries: int,
    state: JobState,
    exit_code: int | None,
    reason: str,
    *,
    retry: bool = True,
) -> list[Statement]:
    """Move a job whose attempt ended in ``state``: back to the queue while a failed
    or lost attempt has retries left (and ``retry``), else to ``state``."""
    if retry and state in RETRIED and job.attempts <= retries:
        left = retries - job.attempts + 1
        why = (
            f"attempt {job.attempts} {state} ({reason}); retrying,"
            f" {left} attempt{'s' if left != 1 else ''} left"
        )
        return job_to(now, job, _S.queued, why)
    return job_to(now, job, state, reason, exit_code=exit_code)
