"""Job and task state transitions as SQL statements, each with its event.

Every change of state is written together with an ``events`` row (time, state,
reason) in the scheduler's transaction, and is checked against the state
machine first::

    queued ──▶ scheduled ──▶ running ──▶ succeeded | failed | cancelled | timed_out | lost
      ▲            │            │
      └────────────┴────────────┘   retry, or a task taken back before it started
"""

import sqlite3
from collections.abc import Sequence
from typing import Any

from gpulayer.contracts import TERMINAL_STATES
from gpulayer.errors import InvalidTransition

Statement = tuple[str, Sequence[Any]]

#: Allowed moves of a job or task (terminal states allow none).
ALLOWED: dict[str, frozenset[str]] = {
    "queued": frozenset({"scheduled", "cancelled"}),
    "scheduled": frozenset({"running", "queued", "cancelled", "lost"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost", "queued"}),
}
TERMINAL = frozenset(s.value for s in TERMINAL_STATES)


def check(current: str, new: str, what: str) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> new`` is allowed."""
    if new not in ALLOWED.get(current, frozenset()):
        raise InvalidTransition(f"{what} cannot go from {current} to {new}")


def event(
    now: float, job_id: str, task_id: str | None, state: str, reason: str | None
) -> list[Statement]:
    """The ``events`` row of a change."""
    return [
        (
            "INSERT INTO events (job_id, task_id, ts, state, reason) VALUES (?, ?, ?, ?, ?)",
            (job_id, task_id, now, state, reason),
        )
    ]


def task_end(
    now: float, task: sqlite3.Row, state: str, exit_code: int | None, reason: str | None
) -> list[Statement]:
    """End ``task`` in ``state``."""
    check(task["state"], state, f"task {task['id']}")
    return [
        (
            "UPDATE tasks SET state = ?, exit_code = ?, reason = ?, ended_at = ? WHERE id = ?",
            (state, exit_code, reason, now, task["id"]),
        ),
        *event(now, task["job_id"], task["id"], state, reason),
    ]


def job_to(
    now: float,
    job: sqlite3.Row,
    state: str,
    reason: str | None,
    *,
    started: bool = False,
    ended: bool = False,
    exit_code: int | None = None,
) -> list[Statement]:
    """Move ``job`` to ``state`` (nothing when it is there already)."""
    if job["state"] == state:
        return []
    check(job["state"], state, f"job {job['id']}")
    sets = ["state = ?", "reason = ?", "updated_at = ?"]
    params: list[Any] = [state, reason, now]
    if started:
        sets.append("started_at = COALESCE(started_at, ?)")
        params.append(now)
    if ended:
        sets += ["ended_at = ?", "exit_code = ?"]
        params += [now, exit_code]
    return [
        (f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*params, job["id"])),
        *event(now, job["id"], None, state, reason),
    ]
