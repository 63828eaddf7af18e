"""Workers: registrations, heartbeats, drain flags, and what their tasks may read."""

from gpulayer.contracts import WorkerState
from gpulayer.errors import NotFound

from .db import Database
from .records import WorkerRecord
from .writes import insert


class WorkerQueries(Database):
    """The ``workers`` table."""

    async def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """One worker by id."""
        row = await self._one("SELECT * FROM workers WHERE id = ?", (worker_id,))
        return None if row is None else WorkerRecord.from_row(row)

    async def worker_by_name(self, name: str) -> WorkerRecord | None:
        """One worker by its unique name."""
        row = await self._one("SELECT * FROM workers WHERE name = ?", (name,))
        return None if row is None else WorkerRecord.from_row(row)

    async def find_worker(self, name_or_id: str) -> WorkerRecord:
        """A worker by name (or id), or :class:`NotFound`."""
        found = await self.worker_by_name(name_or_id) or await self.get_worker(name_or_id)
        if found is None:
            raise NotFound(f"no worker named {name_or_id!r}")
        return found

    async def list_workers(self) -> list[WorkerRecord]:
        """All workers by name."""
        return [
            WorkerRecord.from_row(r) for r in await self._all("SELECT * FROM workers ORDER BY name")
        ]

    async def upsert_worker(self, w: WorkerRecord) -> None:
        """Insert or replace a worker."""
        row = {
            "id": w.id, "name": w.name, "hostname": w.hostname, "state": w.state.value,
            "draining": int(w.draining), "info": w.info_json, "registered_at": w.registered_at,
            "last_heartbeat": w.last_heartbeat, "cpu_percent": w.cpu_percent,
            "memory_used": w.memory_used,
        }  # fmt: skip
        await self._write([insert("workers", row, replace=True)])

    async def heartbeat(
        self, worker_id: str, ts: float, cpu: float | None, mem: int | None
    ) -> None:
        """Record a heartbeat (and bring an unhealthy worker back to ready)."""
        await self._write(
            [
                (
                    "UPDATE workers SET last_heartbeat = ?, cpu_percent = ?, memory_used = ?,"
                    " state = CASE WHEN state IN ('unhealthy', 'offline') THEN"
                    " (CASE WHEN draining THEN 'draining' ELSE 'ready' END)"
                    " ELSE state END WHERE id = ?",
                    (ts, cpu, mem, worker_id),
                )
            ]
        )

    async def set_draining(self, worker_id: str, draining: bool) -> None:
        """Drain a worker (it takes no new tasks), or put it back to work."""
        await self._write(
            [
                (
                    "UPDATE workers SET draining = ?, state = CASE"
                    " WHEN state IN ('ready', 'draining') THEN ? ELSE state END WHERE id = ?",
                    (int(draining), "draining" if draining else "ready", worker_id),
                )
            ]
        )

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        """Move a worker to ``state``."""
        sql = "UPDATE workers SET state = ? WHERE id = ?"
        await self._write([(sql, (state.value, worker_id))])

    async def worker_has_bundle(self, worker_id: str, sha256: str) -> bool:
        """Whether a task placed on the worker (and not ended) has this bundle,
        function payload or shipped wheel."""
        row = await self._one(
            "SELECT 1 FROM tasks JOIN jobs ON jobs.id = tasks.job_id"
            " WHERE tasks.worker_id = ? AND tasks.state IN ('scheduled', 'running')"
            " AND (json_extract(jobs.spec, '$.bundle') = ?"
            " OR json_extract(jobs.spec, '$.function.payload_blob') = ?"
            " OR EXISTS (SELECT 1 FROM json_each(jobs.spec, '$.environment.wheels')"
            " WHERE json_extract(json_each.value, '$.sha256') = ?)) LIMIT 1",
            (worker_id, sha256, sha256, sha256),
        )
        return row is not None

    async def worker_has_push(self, worker_id: str, sha256: str) -> bool:
        """Whether a cell placed on the worker (and not ended) pushes this blob."""
        row = await self._one(
            "SELECT 1 FROM tasks JOIN jobs ON jobs.id = tasks.job_id"
            " WHERE tasks.worker_id = ? AND tasks.state IN ('scheduled', 'running')"
            " AND json_extract(jobs.spec, '$.cell.push_blob') = ? LIMIT 1",
            (worker_id, sha256),
        )
        return row is not None
