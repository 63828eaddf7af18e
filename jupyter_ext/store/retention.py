"""Deleting finished jobs with everything that hangs off them, and the blob
references garbage collection must keep."""

import sqlite3
from collections.abc import Sequence

from gpulayer.contracts import TERMINAL_STATES

from .db import Database, marks

_ENDED = "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATES)) + ")"
#: Rows of a job, children first (``tasks`` and ``results`` reference ``jobs``).
_JOB_TABLES = ("logs", "metrics", "events", "artifacts", "results", "result_parts", "tasks")
#: Where jobs name blobs: artifacts, results, and their specs' bundle, payload, push and
#: shipped wheels.
_BLOB_REFS = (
    "SELECT sha256 FROM artifacts{where}",
    "SELECT sha256 FROM results WHERE sha256 IS NOT NULL{and_}",
    "SELECT json_extract(spec, '$.bundle') FROM jobs{where_id}",
    "SELECT json_extract(spec, '$.function.payload_blob') FROM jobs{where_id}",
    "SELECT json_extract(spec, '$.cell.push_blob') FROM jobs{where_id}",
    "SELECT json_extract(w.value, '$.sha256') FROM (SELECT spec FROM jobs{where_id}) AS j,"
    " json_each(j.spec, '$.environment.wheels') AS w",
)


class RetentionQueries(Database):
    """Which finished jobs a retention policy picks, deleting them, blob references."""

    async def ended_before(self, ts: float, limit: int) -> list[str]:
        """Up to ``limit`` finished jobs that ended before ``ts``, oldest first."""
        sql = f"SELECT id FROM jobs WHERE state IN {_ENDED} AND ended_at < ? ORDER BY seq LIMIT ?"
        return [r["id"] for r in await self._all(sql, (ts, limit), big=True)]

    async def ended_beyond(self, keep: int, limit: int) -> list[str]:
        """Up to ``limit`` finished jobs older than the newest ``keep`` finished ones."""
        sql = f"SELECT id FROM jobs WHERE state IN {_ENDED} ORDER BY seq DESC LIMIT ? OFFSET ?"
        return [r["id"] for r in await self._all(sql, (limit, keep), big=True)]

    async def oldest_ended(self, limit: int) -> list[str]:
        """The ``limit`` oldest finished jobs."""
        sql = f"SELECT id FROM jobs WHERE state IN {_ENDED} ORDER BY seq LIMIT ?"
        return [r["id"] for r in await self._all(sql, (limit,), big=True)]

    async def delete_jobs(self, job_ids: Sequence[str]) -> list[str]:
        """Delete the jobs among ``job_ids`` that ended (and hold no active task),
        with their tasks, events, logs, metrics, artifacts and results, in one
        transaction; answers the ids deleted. A job that has not ended is kept,
        whatever happened since it was picked."""
        if not job_ids:
            return []

        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                f"SELECT id FROM jobs WHERE id IN ({marks(job_ids)}) AND state IN {_ENDED}"
                " AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.job_id = jobs.id"
                " AND tasks.state IN ('scheduled', 'running'))",
                list(job_ids),
            ).fetchall()
            ids = [r[0] for r in rows]
            if ids:
                for table in _JOB_TABLES:
                    conn.execute(f"DELETE FROM {table} WHERE job_id IN ({marks(ids)})", ids)
                conn.execute(f"DELETE FROM jobs WHERE id IN ({marks(ids)})", ids)
            return ids

        return await self._commit(run)

    async def blobs_of_jobs(self, job_ids: Sequence[str]) -> set[str]:
        """The blobs these jobs name (call it before deleting them)."""
        if not job_ids:
            return set()
        in_ = f" job_id IN ({marks(job_ids)})"
        parts = [
            q.format(
                where=" WHERE" + in_, and_=" AND" + in_, where_id=f" WHERE id IN ({marks(job_ids)})"
            )
            for q in _BLOB_REFS
        ]
        rows = await self._all(" UNION ".join(parts), list(job_ids) * len(parts), big=True)
        return {r[0] for r in rows if r[0]}

    async def referenced_blobs(self) -> set[str]:
        """Every blob some stored job still names."""
        parts = [q.format(where="", and_="", where_id="") for q in _BLOB_REFS]
        return {r[0] for r in await self._all(" UNION ".join(parts), big=True) if r[0]}
