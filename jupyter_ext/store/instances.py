"""Provider instances, the workers that joined from them, and provider intents."""

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from .db import Database, marks
from .records import InstanceRecord, IntentRecord, RunSpan
from .writes import Statement, insert

#: Instance columns a service may change with :meth:`InstanceQueries.update_instance`.
_MUTABLE = {
    "state", "external_id", "workers", "job_ids", "reason", "detail", "booted_at",
    "ready_at", "idle_since", "ends_at", "ended_at",
}  # fmt: skip


def _intent(instance_id: str, provider: str, action: str, now: float) -> Statement:
    row = {"instance_id": instance_id, "provider": provider, "action": action, "created_at": now}
    return insert("provider_intents", row)


def _update(instance_id: str, fields: dict[str, Any]) -> Statement:
    bad = set(fields) - _MUTABLE
    if bad:
        raise ValueError(f"instance columns {sorted(bad)} cannot be changed")
    cols = ", ".join(f"{k} = ?" for k in fields)
    values = [json.dumps(v) if isinstance(v, list | tuple) else v for v in fields.values()]
    return f"UPDATE instances SET {cols} WHERE id = ?", (*values, instance_id)


class InstanceQueries(Database):
    """The ``instances``, ``instance_workers`` and ``provider_intents`` tables."""

    #: Whether any worker ever joined from an instance (None: not read yet). Until
    #: one does, a job's read (every call's answer) skips the spans' join.
    _instance_workers_seen: bool | None = None

    async def create_intent(self, r: InstanceRecord) -> int:
        """Store a new instance and the intent to create it, in one transaction; the
        intent's ``seq``."""
        row = {
            "id": r.id, "provider": r.provider, "offer": r.offer, "state": r.state.value,
            "workers": list(r.workers), "nodes": r.nodes, "gpus": r.gpus, "slots": r.slots,
            "job_ids": list(r.job_ids), "price_per_hour": r.price_per_hour, "reason": r.reason,
            "detail": r.detail, "created_at": r.created_at,
        }  # fmt: skip
        return await self._with_intent(
            [insert("instances", row)], _intent(r.id, r.provider, "create", r.created_at)
        )

    async def intent(
        self, instance_id: str, provider: str, action: str, now: float, **fields: Any
    ) -> int:
        """Record the intent to call ``action`` on an instance (and change its row)."""
        stmts = [_update(instance_id, fields)] if fields else []
        return await self._with_intent(stmts, _intent(instance_id, provider, action, now))

    async def _with_intent(self, stmts: list[Statement], intent: Statement) -> int:
        """Run ``stmts`` and then ``intent`` in one transaction; the intent's ``seq``."""

        def run(conn: sqlite3.Connection) -> int:
            for sql, params in stmts:
                conn.execute(sql, params)
            cur = conn.execute(*intent)
            return int(cur.lastrowid or 0)

        return await self._commit(run)

    async def outcome(self, seq: int, outcome: str, now: float, instance_id: str,
                      **fields: Any) -> None:  # fmt: skip
        """Record how intent ``seq`` ended, with the instance's new fields."""
        stmts: list[Statement] = [
            ("UPDATE provider_intents SET outcome = ?, outcome_at = ? WHERE seq = ?",
             (outcome, now, seq)),
        ]  # fmt: skip
        if fields:
            stmts.append(_update(instance_id, fields))
        await self._write(stmts)

    async def open_intents(self) -> list[IntentRecord]:
        """Intents with no outcome (the control plane stopped during the call)."""
        rows = await self._all(
            "SELECT * FROM provider_intents WHERE outcome_at IS NULL ORDER BY seq"
        )
        return [IntentRecord.from_row(r) for r in rows]

    async def update_instance(self, instance_id: str, **fields: Any) -> None:
        """Change an instance's row (no provider call involved)."""
        await self._write([_update(instance_id, fields)])

    async def get_instance(self, instance_id: str) -> InstanceRecord | None:
        """One instance by id."""
        row = await self._one("SELECT * FROM instances WHERE id = ?", (instance_id,))
        return None if row is None else InstanceRecord.from_row(row)

    async def active_instances(self) -> list[InstanceRecord]:
        """Instances not yet gone, lost or failed, oldest first."""
        rows = await self._all(
            "SELECT * FROM instances WHERE state NOT IN ('gone', 'lost', 'failed')"
            " ORDER BY created_at, id"
        )
        return [InstanceRecord.from_row(r) for r in rows]

    async def list_instances(self, limit: int = 200) -> list[InstanceRecord]:
        """Active instances first, then the most recent ended ones."""
        rows = await self._all(
            "SELECT * FROM instances ORDER BY ended_at IS NOT NULL, created_at DESC LIMIT ?",
            (limit,),
        )
        return [InstanceRecord.from_row(r) for r in rows]

    async def joined(self, worker_id: str, instance_id: str, name: str, now: float) -> None:
        """Remember that worker ``worker_id`` came from ``instance_id``."""
        self._instance_workers_seen = True
        await self._write(
            [insert("instance_workers", {"worker_id": worker_id, "instance_id": instance_id,
                                         "worker_name": name, "joined_at": now}, replace=True)]
        )  # fmt: skip

    async def instance_workers(self, instance_ids: Sequence[str]) -> dict[str, list[str]]:
        """Worker ids per instance id."""
        if not instance_ids:
            return {}
        rows = await self._all(
            f"SELECT worker_id, instance_id FROM instance_workers"
            f" WHERE instance_id IN ({marks(instance_ids)})",
            tuple(instance_ids),
        )
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["instance_id"], []).append(r["worker_id"])
        return out

    async def run_spans(self, job_ids: Sequence[str]) -> list[RunSpan]:
        """Each started task of ``job_ids`` that ran on an instance's worker."""
        if not job_ids:
            return []
        if self._instance_workers_seen is None:
            row = await self._one("SELECT 1 FROM instance_workers LIMIT 1", ())
            self._instance_workers_seen = row is not None
        if not self._instance_workers_seen:
            return []
        rows = await self._all(
            "SELECT t.job_id, iw.instance_id, t.started_at, t.ended_at, t.gpu_indices,"
            " i.gpus, i.price_per_hour FROM tasks t"
            " JOIN instance_workers iw ON iw.worker_id = t.worker_id"
            " JOIN instances i ON i.id = iw.instance_id"
            f" WHERE t.job_id IN ({marks(job_ids)}) AND t.started_at IS NOT NULL",
            tuple(job_ids),
        )
        return [
            RunSpan(r[0], r[1], r[2], r[3], len(json.loads(r[4] or "[]")), r[5], r[6]) for r in rows
        ]
