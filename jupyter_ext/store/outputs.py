"""Task outputs, log lines and training metric points: batched appends and paged reads.

A batch carries the task-local number of its first line (or point), so a batch a
worker sends twice is stored once; each batch is one transaction.
"""

import sqlite3
from collections.abc import Sequence
from typing import Any

from gpulayer.contracts import TERMINAL_STATES, LogLine, LogPage

from .db import INLINE_READ_ROWS, INLINE_WRITE_ROWS, Database
from .records import MetricRecord, as_datetime
from .writes import Statement


class OutputQueries(Database):
    """The ``logs`` and ``metrics`` tables: what tasks output."""

    async def append_logs(
        self,
        task_id: str,
        job_id: str,
        first_seq: int,
        lines: Sequence[tuple[Any, ...]],
        max_bytes: int | None = None,
        over: str = "",
        then: Sequence[Statement] = (),
    ) -> int:
        """Store the lines of a batch the task does not have yet.

        ``lines`` are ``(stream, ts, text)`` or ``(stream, ts, text, rank)``; the first
        is line ``first_seq`` of the task. Returns the task's new line count (lines
        dropped by the quota count as taken). With ``max_bytes``, a job keeps at
        most that much log text (UTF-8): the line that would pass it and every later
        one are dropped, and one ``system`` line ``over`` is stored in their place.
        ``then`` runs after the lines in the same transaction (a completion's end,
        whose lines ride it): both are stored, or neither.
        """

        def run(conn: sqlite3.Connection) -> int:
            n = append(conn)
            for sql, params in then:
                conn.execute(sql, params)
            return n

        def append(conn: sqlite3.Connection) -> int:
            trow = conn.execute("SELECT log_seq FROM tasks WHERE id = ?", (task_id,)).fetchone()
            jrow = conn.execute(
                "SELECT log_count, log_bytes FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
            assert trow is not None and jrow is not None
            have, offset, used = int(trow[0]), int(jrow[0]), int(jrow[1])
            fresh = lines[max(0, have - first_seq) :] if first_seq <= have else []
            if not fresh:
                return have
            kept, used = _within(fresh, used, max_bytes, over)
            conn.executemany(
                "INSERT INTO logs (job_id, offset, task_id, stream, ts, text, rank)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (job_id, offset + i, task_id, *line[:3], (*line, None)[3])
                    for i, line in enumerate(kept)
                ],
            )
            conn.execute("UPDATE tasks SET log_seq = ? WHERE id = ?", (have + len(fresh), task_id))
            conn.execute(
                "UPDATE jobs SET log_count = ?, log_bytes = ? WHERE id = ?",
                (offset + len(kept), used, job_id),
            )
            return have + len(fresh)

        return await self._commit(run, small=len(lines) + len(then) <= INLINE_WRITE_ROWS)

    async def log_usage(self, job_id: str) -> tuple[int, int]:
        """A job's stored log: its line count (the next line's offset) and its bytes."""
        row = await self._one("SELECT log_count, log_bytes FROM jobs WHERE id = ?", (job_id,))
        return (int(row[0]), int(row[1])) if row is not None else (0, 0)

    async def log_page(
        self, job_id: str, offset: int, limit: int, attempt: int | None = None
    ) -> LogPage:
        """Lines of a job from ``offset`` (only attempt ``attempt``'s when given), and
        whether the job's output is complete."""
        if attempt is not None:
            return await self._attempt_page(job_id, offset, limit, attempt)
        rows = await self._all(
            "SELECT * FROM logs WHERE job_id = ? AND offset >= ? ORDER BY offset LIMIT ?",
            (job_id, offset, limit),
            big=limit > INLINE_READ_ROWS,
        )
        job = await self._one("SELECT state, log_count FROM jobs WHERE id = ?", (job_id,))
        assert job is not None
        nxt = offset + len(rows)
        complete = job["state"] in TERMINAL_STATES and nxt >= job["log_count"]
        return LogPage(lines=_lines(rows), next_offset=nxt, complete=complete)

    async def _attempt_page(self, job_id: str, offset: int, limit: int, attempt: int) -> LogPage:
        """The lines of one attempt's tasks from ``offset``: offsets stay the job's, so
        ``next_offset`` skips the other attempts' lines."""
        job = await self._one("SELECT state, log_count FROM jobs WHERE id = ?", (job_id,))
        assert job is not None
        count = int(job["log_count"])
        rows = await self._all(
            "SELECT * FROM logs WHERE job_id = ? AND offset >= ? AND offset < ? AND task_id IN"
            " (SELECT id FROM tasks WHERE job_id = ? AND attempt = ?) ORDER BY offset LIMIT ?",
            (job_id, offset, count, job_id, attempt, limit),
            big=limit > INLINE_READ_ROWS,
        )
        nxt = rows[-1]["offset"] + 1 if len(rows) == limit else max(offset, count)
        complete = job["state"] in TERMINAL_STATES and nxt >= count
        return LogPage(lines=_lines(rows), next_offset=nxt, complete=complete)

    async def append_metrics(
        self, task_id: str, job_id: str, first_seq: int, points: Sequence[tuple[Any, ...]]
    ) -> int:
        """Store the points of a batch the task does not have yet (as :meth:`append_logs`).

        ``points`` are ``(rank, step, epoch, ts, metrics_json)``; returns the task's
        new point count.
        """

        def run(conn: sqlite3.Connection) -> int:
            trow = conn.execute("SELECT metric_seq FROM tasks WHERE id = ?", (task_id,)).fetchone()
            assert trow is not None
            have = int(trow[0])
            fresh = points[max(0, have - first_seq) :] if first_seq <= have else []
            if fresh:
                last = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM metrics WHERE job_id = ?", (job_id,)
                ).fetchone()[0]
                conn.executemany(
                    "INSERT INTO metrics (job_id, seq, task_id, rank, step, epoch, ts,"
                    " metrics) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(job_id, last + 1 + i, task_id, *p) for i, p in enumerate(fresh)],
                )
                conn.execute(
                    "UPDATE tasks SET metric_seq = ? WHERE id = ?", (have + len(fresh), task_id)
                )
            return have + len(fresh)

        return await self._commit(run, small=len(points) <= INLINE_WRITE_ROWS)

    async def read_metrics(self, job_id: str, after: int, limit: int) -> list[MetricRecord]:
        """Up to ``limit`` metric points of a job with ``seq`` above ``after``."""
        rows = await self._all(
            "SELECT * FROM metrics WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, after, limit),
            big=limit > INLINE_READ_ROWS,
        )
        return [MetricRecord.from_row(r) for r in rows]


def _within(
    lines: Sequence[tuple[Any, ...]], used: int, max_bytes: int | None, over: str
) -> tuple[list[tuple[Any, ...]], int]:
    """The lines a job with ``used`` bytes of log may still keep, plus the one marker
    line where the quota is reached; and its new byte count (past ``max_bytes`` once
    the marker is stored, so later lines are all dropped)."""
    if max_bytes is None:
        return list(lines), used + sum(len(line[2].encode()) for line in lines)
    kept: list[tuple[Any, ...]] = []
    for line in lines:
        if used > max_bytes:
            break
        size = len(line[2].encode())
        if used + size > max_bytes:
            kept.append(("system", line[1], over, None))
            used = max_bytes + 1
            break
        kept.append(line)
        used += size
    return kept, used


def _lines(rows: Sequence[sqlite3.Row]) -> list[LogLine]:
    return [
        LogLine(
            offset=r["offset"],
            stream=r["stream"],
            ts=as_datetime(r["ts"]),
            text=r["text"],
            task_id=r["task_id"],
            rank=r["rank"],
        )
        for r in rows
    ]
