"""The statements that change jobs, tasks, events and results (and the tokens
that live and end with a task).

Only :mod:`jupyter_ext.transitions` builds the ones that change a state (it
checks each change against the state machine first); the task intake builds
:func:`put_result`. The services hand the lists to :meth:`Store.apply`, which runs
them in one transaction. A :data:`Statement` is opaque outside the store.
"""

import json
from collections.abc import Sequence
from typing import Any

from .records import TokenRecord

Statement = tuple[str, Sequence[Any]]


def insert(table: str, row: dict[str, Any], *, replace: bool = False) -> Statement:
    """An INSERT statement for ``row`` (dict and list values are stored as JSON)."""
    cols = list(row)
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    sql = f"{verb} INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    values = [json.dumps(v) if isinstance(v, dict | list) else v for v in row.values()]
    return sql, values


def insert_job(
    job_id: str,
    spec_json: str,
    owner: str,
    priority: int,
    reason: str,
    now: float,
    *,
    state: str = "queued",
    worker_id: str | None = None,
    started_at: float | None = None,
) -> Statement:
    """A new ``queued`` job (or, with ``worker_id``, one in its first attempt there,
    ``scheduled`` or ``running`` since ``started_at``)."""
    row = {
        "id": job_id, "spec": spec_json, "state": state, "reason": reason, "owner": owner,
        "priority": priority, "attempts": 0 if worker_id is None else 1,
        "worker_id": worker_id, "created_at": now, "updated_at": started_at or now,
        "started_at": started_at,
    }  # fmt: skip
    return insert("jobs", row)


def insert_event(
    job_id: str, task_id: str | None, ts: float, state: str, reason: str | None
) -> Statement:
    """An ``events`` row."""
    return (
        "INSERT INTO events (job_id, task_id, ts, state, reason) VALUES (?, ?, ?, ?, ?)",
        (job_id, task_id, ts, state, reason),
    )


def insert_events(events: Sequence[tuple[str, str | None, float, str, str | None]]) -> Statement:
    """Several ``events`` rows ``(job_id, task_id, ts, state, reason)``, in this order."""
    values = ", ".join(["(?, ?, ?, ?, ?)"] * len(events))
    params = [v for event in events for v in event]
    return f"INSERT INTO events (job_id, task_id, ts, state, reason) VALUES {values}", params


def insert_task(
    task_id: str,
    job_id: str,
    attempt: int,
    worker_id: str,
    gpus: Sequence[int],
    now: float,
    node_rank: int | None = None,
    gang_json: str | None = None,
    *,
    state: str = "scheduled",
    started_at: float | None = None,
    lease_expires: float | None = None,
) -> Statement:
    """A new ``scheduled`` task (or one ``running`` since ``started_at``)."""
    row = {
        "id": task_id, "job_id": job_id, "attempt": attempt, "state": state,
        "worker_id": worker_id, "gpu_indices": json.dumps(list(gpus)), "created_at": now,
        "node_rank": node_rank, "gang": gang_json, "started_at": started_at,
        "lease_expires": lease_expires,
    }  # fmt: skip
    return insert("tasks", row)


def set_job_attempt(job_id: str, attempts: int, worker_id: str | None) -> Statement:
    """A job's attempt count and (head) worker."""
    return "UPDATE jobs SET attempts = ?, worker_id = ? WHERE id = ?", (attempts, worker_id, job_id)


def set_job_state(
    job_id: str,
    state: str,
    reason: str | None,
    now: float,
    *,
    started: bool = False,
    ended: bool = False,
    exit_code: int | None = None,
) -> Statement:
    """A job's new state (and start or end time)."""
    sets = ["state = ?", "reason = ?", "updated_at = ?"]
    params: list[Any] = [state, reason, now]
    if started:
        sets.append("started_at = COALESCE(started_at, ?)")
        params.append(now)
    if ended:
        sets += ["ended_at = ?", "exit_code = ?"]
        params += [now, exit_code]
    return f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*params, job_id)


def set_task_environment(task_id: str, environment_json: str) -> Statement:
    """Keep the worker's latest report on a task's Python environment."""
    return "UPDATE tasks SET environment = ? WHERE id = ?", (environment_json, task_id)


def set_task_running(task_id: str, now: float, lease_expires: float) -> Statement:
    """A task its worker picked up."""
    return (
        "UPDATE tasks SET state = 'running', started_at = ?, lease_expires = ? WHERE id = ?",
        (now, lease_expires, task_id),
    )


def set_task_ended(
    task_id: str, state: str, exit_code: int | None, reason: str | None, now: float
) -> Statement:
    """A task's end."""
    return (
        "UPDATE tasks SET state = ?, exit_code = ?, reason = ?, ended_at = ? WHERE id = ?",
        (state, exit_code, reason, now, task_id),
    )


def set_cancel_requested(task_id: str) -> Statement:
    """Flag a running task to be cancelled by its worker."""
    return "UPDATE tasks SET cancel_requested = 1 WHERE id = ?", (task_id,)


def put_result(
    job_id: str, task_id: str, inline: bytes | None, sha256: str | None, size: int
) -> Statement:
    """Keep a job's result (the latest attempt's wins)."""
    row = {"job_id": job_id, "task_id": task_id, "inline": inline, "sha256": sha256, "size": size}
    return insert("results", row, replace=True)


def forget_parts_of(job_id: str, task_id: str) -> Statement:
    """Drop a task's result parts: its result holds those outcomes too (by its job
    first: the table's key, not a scan)."""
    return "DELETE FROM result_parts WHERE job_id = ? AND task_id = ?", (job_id, task_id)


def delete_worker(worker_id: str) -> Statement:
    """Forget a worker (its name may be registered again)."""
    return "DELETE FROM workers WHERE id = ?", (worker_id,)


def insert_token(t: TokenRecord) -> Statement:
    """A new token record (its hash, never the token)."""
    row = {
        "id": t.id, "name": t.name, "role": t.role, "hash": t.hash,
        "created_at": t.created_at, "expires_at": t.expires_at, "revoked_at": t.revoked_at,
        "worker_id": t.worker_id, "single_use": int(t.single_use), "task_id": t.task_id,
        "instance_id": t.instance_id,
    }  # fmt: skip
    return insert("tokens", row)


def revoke_task_tokens(task_id: str, now: float) -> Statement:
    """Revoke the token of a task that ends (nothing when it has none)."""
    sql = "UPDATE tokens SET revoked_at = ? WHERE task_id = ? AND revoked_at IS NULL"
    return sql, (now, task_id)


def insert_idempotency_key(
    owner: str, key: str, digest: str, job_ids: Sequence[str], now: float, expired_before: float
) -> list[Statement]:
    """Remember that ``owner``'s submit with ``key`` created ``job_ids`` (replacing an
    expired record of the key; a live one makes the insert a conflict)."""
    row = {
        "owner": owner, "key": key, "digest": digest, "job_ids": list(job_ids), "created_at": now,
    }  # fmt: skip
    forget = "DELETE FROM idempotency_keys WHERE owner = ? AND key = ? AND created_at < ?"
    return [(forget, (owner, key, expired_before)), insert("idempotency_keys", row)]


def append_system_line(job_id: str, task_id: str, ts: float, text: str) -> list[Statement]:
    """A ``system`` log line of the control plane's own, after the job's last line."""
    return [
        (
            "INSERT INTO logs (job_id, offset, task_id, stream, ts, text, rank)"
            " SELECT id, log_count, ?, 'system', ?, ?, NULL FROM jobs WHERE id = ?",
            (task_id, ts, text, job_id),
        ),
        ("UPDATE jobs SET log_count = log_count + 1 WHERE id = ?", (job_id,)),
    ]
