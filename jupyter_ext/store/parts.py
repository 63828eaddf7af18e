"""Result parts: each call's outcome of a function task of several calls, kept as
it finishes, so the calls an attempt finished survive its worker (docs/adr/0096)."""

from collections.abc import Sequence

from gpulayer.contracts import ResultPart

from .db import Database, marks


class PartQueries(Database):
    """The ``result_parts`` table: one row per (job, call index); the first attempt
    to finish a call keeps it."""

    async def put_parts(
        self, job_id: str, task_id: str, attempt: int, parts: Sequence[tuple[int, bytes]]
    ) -> None:
        """Keep the outcomes of calls ``(index, outcome)`` (a call kept already stays)."""
        sql = (
            "INSERT OR IGNORE INTO result_parts (job_id, idx, task_id, attempt, outcome)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        await self._write([(sql, (job_id, i, task_id, attempt, data)) for i, data in parts])

    async def parts_of(self, job_id: str) -> list[ResultPart]:
        """A job's kept call outcomes, by index."""
        sql = "SELECT idx, attempt, outcome FROM result_parts WHERE job_id = ? ORDER BY idx"
        rows = await self._all(sql, (job_id,))
        return [ResultPart(index=r[0], attempt=r[1], outcome=bytes(r[2])) for r in rows]

    async def part_indexes(self, job_id: str) -> list[int]:
        """The calls of a job whose outcomes are kept."""
        sql = "SELECT idx FROM result_parts WHERE job_id = ? ORDER BY idx"
        return [r[0] for r in await self._all(sql, (job_id,))]

    async def part_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """How many call outcomes are kept per job (jobs with none left out)."""
        if not job_ids:
            return {}
        sql = (
            "SELECT job_id, COUNT(*) FROM result_parts"
            f" WHERE job_id IN ({marks(job_ids)}) GROUP BY job_id"
        )
        return {r[0]: r[1] for r in await self._all(sql, list(job_ids))}
