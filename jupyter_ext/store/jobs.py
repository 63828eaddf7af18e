"""Reads of jobs, tasks, events, results and artifacts (their writes are
:mod:`~jupyter_ext.store.writes` statements, built by the transitions)."""

from collections.abc import Iterable, Sequence

from gpulayer.contracts import JobState

from .db import Database, marks
from .records import (
    ArtifactRecord,
    EventRecord,
    Hold,
    IdempotencyRecord,
    JobRecord,
    ResultRecord,
    TaskRecord,
)
from .writes import insert, set_task_environment

_ACTIVE = "('scheduled', 'running')"


class JobQueries(Database):
    """Jobs and what hangs off them."""

    async def get_job(self, job_id: str) -> JobRecord | None:
        """One job by id."""
        row = await self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else JobRecord.from_row(row)

    async def jobs_by_ids(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """The jobs among ``job_ids`` that exist."""
        sql = f"SELECT * FROM jobs WHERE id IN ({marks(job_ids)})"
        return [JobRecord.from_row(r) for r in await self._all(sql, job_ids)]

    async def list_jobs(
        self, state: JobState | None, limit: int, owner: str | None = None
    ) -> list[JobRecord]:
        """Jobs newest first, optionally of one state and of one owner."""
        where = [(c, v) for c, v in (("state", state), ("owner", owner)) if v is not None]
        sql = "SELECT * FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(f"{c} = ?" for c, _ in where)
        rows = await self._all(
            sql + " ORDER BY seq DESC LIMIT ?", (*(v for _, v in where), limit), big=limit > 100
        )
        return [JobRecord.from_row(r) for r in rows]

    async def count_jobs(self, states: Sequence[JobState], owner: str | None = None) -> int:
        """How many jobs (of ``owner``, when given) are in any of ``states``."""
        sql = f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks(states)})"
        args: list[str] = [s.value for s in states]
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        row = await self._one(sql, args)
        return int(row[0]) if row else 0

    async def active_kernel_jobs(
        self, states: Sequence[JobState] = (JobState.queued, JobState.scheduled, JobState.running)
    ) -> list[JobRecord]:
        """Sessions and cells in a session that have not ended (or are in ``states``),
        oldest first. Each row in ``states`` is read: the once-a-second idle sweep asks
        for the running ones only, never every queued job (benchmarks/burst.py)."""
        rows = await self._all(
            f"SELECT * FROM jobs WHERE state IN ({marks(states)})"
            " AND (json_extract(spec, '$.kind') = 'session'"
            " OR json_extract(spec, '$.cell.session') IS NOT NULL) ORDER BY seq",
            [s.value for s in states],
        )
        return [JobRecord.from_row(r) for r in rows]

    # ---------------------------------------------------------------- tasks

    async def get_task(self, task_id: str) -> TaskRecord | None:
        """One task by id."""
        row = await self._one("SELECT * FROM tasks WHERE id = ?", (task_id,))
        return None if row is None else TaskRecord.from_row(row)

    async def tasks_of_job(self, job_id: str) -> list[TaskRecord]:
        """A job's tasks, oldest attempt first."""
        sql = "SELECT * FROM tasks WHERE job_id = ? ORDER BY attempt"
        return [TaskRecord.from_row(r) for r in await self._all(sql, (job_id,))]

    async def active_tasks(self, worker_id: str | None = None) -> list[TaskRecord]:
        """Tasks that hold resources (scheduled or running), optionally of one worker."""
        if worker_id is None:
            rows = await self._all(f"SELECT * FROM tasks WHERE state IN {_ACTIVE}")
        else:
            sql = f"SELECT * FROM tasks WHERE worker_id = ? AND state IN {_ACTIVE}"
            rows = await self._all(sql, (worker_id,))
        return [TaskRecord.from_row(r) for r in rows]

    async def holds(self) -> list[Hold]:
        """What every active task holds (its worker, its GPUs): placement's lean read,
        from memory (``changes.ActiveHolds``, kept in step with every commit)."""
        return list(self.active_holds.by_task.values())

    async def expired_leases(self, now: float) -> list[TaskRecord]:
        """Running tasks whose lease ran out."""
        sql = "SELECT * FROM tasks WHERE state = 'running' AND lease_expires < ?"
        return [TaskRecord.from_row(r) for r in await self._all(sql, (now,))]

    async def renew_leases(self, worker_id: str, task_ids: Sequence[str], until: float) -> None:
        """Extend the leases of a worker's running tasks."""
        if not task_ids:
            return
        sql = (
            "UPDATE tasks SET lease_expires = ? WHERE worker_id = ?"
            f" AND state = 'running' AND id IN ({marks(task_ids)})"
        )
        await self._write([(sql, (until, worker_id, *task_ids))])

    async def set_task_environment(self, task_id: str, environment_json: str) -> None:
        """Keep the worker's latest report on a task's Python environment."""
        await self._write([set_task_environment(task_id, environment_json)])

    async def extend_all_leases(self, until: float) -> None:
        """After a restart: give every running task time for its worker to return."""
        await self._write(
            [("UPDATE tasks SET lease_expires = ? WHERE state = 'running'", (until,))]
        )

    # ------------------------------------------------ events, results, files

    async def events_of_job(self, job_id: str) -> list[EventRecord]:
        """A job's events, oldest first."""
        sql = "SELECT * FROM events WHERE job_id = ? ORDER BY seq"
        return [EventRecord.from_row(r) for r in await self._all(sql, (job_id,))]

    async def result(self, job_id: str) -> ResultRecord | None:
        """A job's stored result."""
        row = await self._one("SELECT * FROM results WHERE job_id = ?", (job_id,))
        return None if row is None else ResultRecord.from_row(row)

    async def results(self, job_ids: Sequence[str]) -> dict[str, ResultRecord]:
        """Results of several jobs, by job id."""
        sql = f"SELECT * FROM results WHERE job_id IN ({marks(job_ids)})"
        return {r["job_id"]: ResultRecord.from_row(r) for r in await self._all(sql, job_ids)}

    async def put_artifact(self, art: ArtifactRecord) -> None:
        """Record (or replace) a job's artifact."""
        row = {
            "job_id": art.job_id, "name": art.name, "sha256": art.sha256, "size": art.size,
            "created_at": art.created_at,
        }  # fmt: skip
        await self._write([insert("artifacts", row, replace=True)])

    async def artifacts_of_job(self, job_id: str) -> list[ArtifactRecord]:
        """A job's artifacts by name."""
        sql = "SELECT * FROM artifacts WHERE job_id = ? ORDER BY name"
        return [ArtifactRecord.from_row(r) for r in await self._all(sql, (job_id,))]

    async def add_blob_owner(self, sha256: str, owner: str, now: float) -> None:
        """Record that ``owner`` uploaded blob ``sha256`` (again: no change)."""
        sql = "INSERT OR IGNORE INTO blob_owners (sha256, owner, uploaded_at) VALUES (?, ?, ?)"
        await self._write([(sql, (sha256, owner, now))])

    async def forget_blob_owners(self, sha256s: Iterable[str]) -> None:
        """Forget who uploaded these blobs (they were deleted)."""
        sql = "DELETE FROM blob_owners WHERE sha256 = ?"
        await self._write([(sql, (sha,)) for sha in sha256s])

    async def owns_blob(self, sha256: str, owner: str) -> bool:
        """Whether ``owner`` uploaded blob ``sha256``."""
        sql = "SELECT 1 FROM blob_owners WHERE sha256 = ? AND owner = ?"
        return await self._one(sql, (sha256, owner)) is not None

    async def owned_task_ids(self, owner: str, task_ids: Iterable[str]) -> set[str]:
        """The tasks among ``task_ids`` whose job ``owner`` submitted."""
        ids, mine = sorted(set(task_ids)), set[str]()
        for i in range(0, len(ids), 500):  # under SQLite's limit on bound values
            chunk = ids[i : i + 500]
            sql = (
                "SELECT t.id FROM tasks t JOIN jobs j ON j.id = t.job_id"
                f" WHERE j.owner = ? AND t.id IN ({marks(chunk)})"
            )
            mine.update(r["id"] for r in await self._all(sql, (owner, *chunk)))
        return mine

    async def get_artifact(self, job_id: str, name: str) -> ArtifactRecord | None:
        """One artifact of a job."""
        sql = "SELECT * FROM artifacts WHERE job_id = ? AND name = ?"
        row = await self._one(sql, (job_id, name))
        return None if row is None else ArtifactRecord.from_row(row)

    # ------------------------------------------------------ idempotency keys

    async def idempotency_key(self, owner: str, key: str) -> IdempotencyRecord | None:
        """What ``owner``'s submit with ``key`` created (expired records included)."""
        sql = "SELECT * FROM idempotency_keys WHERE owner = ? AND key = ?"
        row = await self._one(sql, (owner, key))
        return None if row is None else IdempotencyRecord.from_row(row)

    async def prune_idempotency_keys(self, before: float) -> None:
        """Forget idempotency keys recorded before ``before``."""
        await self._write([("DELETE FROM idempotency_keys WHERE created_at < ?", (before,))])
