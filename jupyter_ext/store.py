"""The embedded store: one SQLite file in WAL mode behind one aiosqlite connection.

One long-lived connection is the single writer; aiosqlite runs its calls in order
on its own thread, so handlers never block the event loop. The schema version
lives in ``PRAGMA user_version`` and :meth:`Store.open` migrates an older file in
place, step by step (``_MIGRATIONS[n]`` moves version ``n`` to ``n + 1``).

Rows keep times as UNIX seconds (REAL); the scheduler turns them into contract
models. All SQL is parameterized.
"""

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from gpulayer.contracts import (
    TERMINAL_STATES,
    Job,
    JobSpec,
    LogLine,
    LogPage,
    Task,
    Worker,
    WorkerState,
)
from gpulayer.errors import Conflict, NotFound

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS jobs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    spec        TEXT NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT,
    owner       TEXT NOT NULL,
    priority    INTEGER NOT NULL DEFAULT 0,
    exit_code   INTEGER,
    attempts    INTEGER NOT NULL DEFAULT 0,
    worker_id   TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    started_at  REAL,
    ended_at    REAL,
    log_count   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority, seq);
CREATE TABLE IF NOT EXISTS tasks (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs (id),
    attempt          INTEGER NOT NULL,
    state            TEXT NOT NULL,
    worker_id        TEXT,
    gpu_indices      TEXT NOT NULL DEFAULT '[]',
    exit_code        INTEGER,
    reason           TEXT,
    created_at       REAL NOT NULL,
    started_at       REAL,
    ended_at         REAL,
    lease_expires    REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    log_seq          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks (job_id, attempt);
CREATE INDEX IF NOT EXISTS tasks_by_worker ON tasks (worker_id, state);
CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id   TEXT NOT NULL,
    task_id  TEXT,
    ts       REAL NOT NULL,
    state    TEXT NOT NULL,
    reason   TEXT
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS logs (
    job_id   TEXT NOT NULL,
    offset   INTEGER NOT NULL,
    task_id  TEXT,
    stream   TEXT NOT NULL,
    ts       REAL NOT NULL,
    text     TEXT NOT NULL,
    PRIMARY KEY (job_id, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS artifacts (
    job_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    size       INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS workers (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    hostname        TEXT NOT NULL,
    state           TEXT NOT NULL,
    info            TEXT NOT NULL,
    registered_at   REAL NOT NULL,
    last_heartbeat  REAL,
    cpu_percent     REAL,
    memory_used     INTEGER
);
CREATE TABLE IF NOT EXISTS tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL,
    worker_id   TEXT
);
"""

# v2: a drained worker stays draining across heartbeats and re-registrations.
_SCHEMA_V2 = """
ALTER TABLE workers ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
"""

# v3: single-use join tokens (consumed by the one registration they allow).
_SCHEMA_V3 = """
ALTER TABLE tokens ADD COLUMN single_use INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tokens ADD COLUMN used_at REAL;
CREATE INDEX IF NOT EXISTS tokens_by_name ON tokens (name);
"""

# v4: what function jobs returned (pickled outcomes), inline or as a blob.
_SCHEMA_V4 = """
CREATE TABLE IF NOT EXISTS results (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id),
    task_id     TEXT NOT NULL,
    inline      BLOB,
    sha256      TEXT,
    size        INTEGER NOT NULL
);
"""

# v5: distributed jobs (a task's node and rendezvous, a log line's rank) and the
# training metrics their tasks ship.
_SCHEMA_V5 = """
ALTER TABLE tasks ADD COLUMN node_rank INTEGER;
ALTER TABLE tasks ADD COLUMN gang TEXT;
ALTER TABLE tasks ADD COLUMN metric_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE logs ADD COLUMN rank INTEGER;
CREATE TABLE IF NOT EXISTS metrics (
    job_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    task_id  TEXT,
    rank     INTEGER,
    step     INTEGER,
    epoch    INTEGER,
    ts       REAL NOT NULL,
    metrics  TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
"""

#: Index n holds the script that moves a database from version n to n + 1.
_MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3, _SCHEMA_V4, _SCHEMA_V5)
SCHEMA_VERSION = len(_MIGRATIONS)


T = TypeVar("T")

_TERMINAL_STATES = frozenset(s.value for s in TERMINAL_STATES)


class Store:
    """Async access to the gpulayer database.

    Methods are small and named for what the scheduler needs; each write
    commits before it returns, and batched writes (log lines) use one
    transaction for the whole batch.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: aiosqlite.Connection | None = None
        # One connection means one transaction at a time: coroutines take turns.
        self._tx = asyncio.Lock()

    # ------------------------------------------------------------ lifecycle

    async def open(self) -> "Store":
        """Open (creating or migrating) the database file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(self.path, isolation_level=None)
        db.row_factory = sqlite3.Row
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        await db.execute("PRAGMA foreign_keys=ON")
        await db.execute("PRAGMA busy_timeout=5000")
        self._db = db
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._db is not None:
            await self._db.close()
            self._db = None

    @property
    def db(self) -> aiosqlite.Connection:
        """The open connection."""
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    async def schema_version(self) -> int:
        """The file's ``PRAGMA user_version``."""
        row = await self._one("PRAGMA user_version")
        return int(row[0]) if row else 0

    async def _migrate(self) -> None:
        version = await self.schema_version()
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has schema version {version}; this gpulayer knows up to"
                f" {SCHEMA_VERSION}. Upgrade gpulayer or use another --data-dir."
            )
        for step in range(version, SCHEMA_VERSION):
            await self.db.executescript(
                "BEGIN;" + _MIGRATIONS[step] + f"PRAGMA user_version={step + 1};COMMIT;"
            )

    # -------------------------------------------------------------- helpers

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = await self.db.execute_fetchall(sql, params)
        return next(iter(rows), None)

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(await self.db.execute_fetchall(sql, params))

    async def _in_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on aiosqlite's thread in one hand-off.

        A transaction of n statements through the public API costs n + 2 thread
        round trips, each a pair of context switches; this costs one
        (docs/adr/0013). It uses aiosqlite's ``_execute`` and ``_conn``, the
        primitives every public method is built on.
        """
        db = self.db
        return await db._execute(lambda: fn(db._conn))

    async def _write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Run several statements in one transaction."""
        stmts = list(statements)

        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                for sql, params in stmts:
                    conn.execute(sql, params)

        async with self._tx:
            await self._in_thread(run)

    # ----------------------------------------------------------------- jobs

    async def insert_jobs(self, jobs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """Store new jobs, each with its first event, in one transaction."""
        await self._write(
            stmt for row, event in jobs for stmt in (_insert("jobs", row), _insert("events", event))
        )

    async def result(self, job_id: str) -> sqlite3.Row | None:
        """A function job's stored result row (``inline`` bytes or ``sha256``, ``size``)."""
        return await self._one("SELECT * FROM results WHERE job_id = ?", (job_id,))

    async def results(self, job_ids: Sequence[str]) -> dict[str, sqlite3.Row]:
        """Result rows of several jobs, by job id."""
        marks = ",".join("?" * len(job_ids))
        rows = await self._all(f"SELECT * FROM results WHERE job_id IN ({marks})", job_ids)
        return {r["job_id"]: r for r in rows}

    async def get_job(self, job_id: str) -> sqlite3.Row | None:
        """One job row by id."""
        return await self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))

    async def jobs_by_ids(self, job_ids: Sequence[str]) -> list[sqlite3.Row]:
        """The job rows among ``job_ids`` that exist."""
        marks = ",".join("?" * len(job_ids))
        return await self._all(f"SELECT * FROM jobs WHERE id IN ({marks})", job_ids)

    async def list_jobs(
        self, state: str | None, limit: int, owner: str | None = None
    ) -> list[sqlite3.Row]:
        """Jobs newest first, optionally of one state and of one owner."""
        where = [(c, v) for c, v in (("state", state), ("owner", owner)) if v is not None]
        sql = "SELECT * FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(f"{c} = ?" for c, _ in where)
        return await self._all(sql + " ORDER BY seq DESC LIMIT ?", (*(v for _, v in where), limit))

    async def queued_jobs(self, page: int = 500) -> AsyncIterator[sqlite3.Row]:
        """Queued jobs in placement order (priority, then submission), ``page`` rows
        at a time, so a pass that stops early reads only what it looked at."""
        last: tuple[int, int] | None = None
        while True:
            if last is None:
                rows = await self._all(
                    "SELECT * FROM jobs WHERE state = 'queued'"
                    " ORDER BY priority DESC, seq ASC LIMIT ?",
                    (page,),
                )
            else:
                rows = await self._all(
                    "SELECT * FROM jobs WHERE state = 'queued' AND (priority < ?"
                    " OR (priority = ? AND seq > ?)) ORDER BY priority DESC, seq ASC LIMIT ?",
                    (last[0], last[0], last[1], page),
                )
            for row in rows:
                yield row
            if len(rows) < page:
                return
            last = (rows[-1]["priority"], rows[-1]["seq"])

    async def any_queued(self) -> bool:
        """Whether some job waits for placement (one index lookup)."""
        return await self._one("SELECT 1 FROM jobs WHERE state = 'queued' LIMIT 1") is not None

    async def count_jobs(self, states: Sequence[str]) -> int:
        """How many jobs are in any of ``states``."""
        marks = ",".join("?" * len(states))
        row = await self._one(f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})", states)
        return int(row[0]) if row else 0

    # ---------------------------------------------------------------- tasks

    async def get_task(self, task_id: str) -> sqlite3.Row | None:
        """One task row by id."""
        return await self._one("SELECT * FROM tasks WHERE id = ?", (task_id,))

    async def tasks_of_job(self, job_id: str) -> list[sqlite3.Row]:
        """A job's tasks, oldest attempt first."""
        return await self._all("SELECT * FROM tasks WHERE job_id = ? ORDER BY attempt", (job_id,))

    async def active_tasks(self, worker_id: str | None = None) -> list[sqlite3.Row]:
        """Tasks that hold resources (scheduled or running), optionally of one worker."""
        if worker_id is None:
            return await self._all("SELECT * FROM tasks WHERE state IN ('scheduled', 'running')")
        return await self._all(
            "SELECT * FROM tasks WHERE worker_id = ? AND state IN ('scheduled', 'running')",
            (worker_id,),
        )

    async def expired_leases(self, now: float) -> list[sqlite3.Row]:
        """Running tasks whose lease ran out."""
        return await self._all(
            "SELECT * FROM tasks WHERE state = 'running' AND lease_expires < ?", (now,)
        )

    async def renew_leases(self, worker_id: str, task_ids: Sequence[str], until: float) -> None:
        """Extend the leases of a worker's running tasks."""
        if not task_ids:
            return
        marks = ",".join("?" * len(task_ids))
        await self._write(
            [
                (
                    f"UPDATE tasks SET lease_expires = ? WHERE worker_id = ?"
                    f" AND state = 'running' AND id IN ({marks})",
                    (until, worker_id, *task_ids),
                )
            ]
        )

    async def extend_all_leases(self, until: float) -> None:
        """After a restart: give every running task time for its worker to return."""
        await self._write(
            [("UPDATE tasks SET lease_expires = ? WHERE state = 'running'", (until,))]
        )

    async def apply(self, statements: list[tuple[str, Sequence[Any]]]) -> None:
        """Run the scheduler's prepared statements in one transaction."""
        await self._write(statements)

    # ----------------------------------------------------------------- logs

    async def append_logs(
        self, task_id: str, job_id: str, first_seq: int, lines: Sequence[tuple[Any, ...]]
    ) -> int:
        """Store the lines of a batch the task does not have yet.

        ``lines`` are ``(stream, ts, text)`` or ``(stream, ts, text, rank)``; the first
        is line ``first_seq`` of the task. Returns the task's new line count. One
        transaction per batch.
        """

        def run(conn: sqlite3.Connection) -> tuple[int, int]:
            with _transaction(conn):
                trow = conn.execute("SELECT log_seq FROM tasks WHERE id = ?", (task_id,)).fetchone()
                jrow = conn.execute("SELECT log_count FROM jobs WHERE id = ?", (job_id,)).fetchone()
                assert trow is not None and jrow is not None
                have, offset = int(trow[0]), int(jrow[0])
                skip = max(0, have - first_seq)
                fresh = lines[skip:] if first_seq <= have else []
                if fresh:
                    conn.executemany(
                        "INSERT INTO logs (job_id, offset, task_id, stream, ts, text, rank)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [
                            (job_id, offset + i, task_id, *line[:3], (*line, None)[3])
                            for i, line in enumerate(fresh)
                        ],
                    )
                    conn.execute(
                        "UPDATE tasks SET log_seq = ? WHERE id = ?", (have + len(fresh), task_id)
                    )
                    conn.execute(
                        "UPDATE jobs SET log_count = ? WHERE id = ?", (offset + len(fresh), job_id)
                    )
                return have, len(fresh)

        async with self._tx:
            have, n = await self._in_thread(run)
        return have + n

    async def log_page(self, job_id: str, offset: int, limit: int) -> LogPage:
        """Lines of a job from ``offset``, and whether the job's output is complete."""
        rows = await self.read_logs(job_id, offset, limit)
        job = await self.get_job(job_id)
        assert job is not None
        nxt = offset + len(rows)
        lines = [
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
        complete = job["state"] in _TERMINAL_STATES and nxt >= job["log_count"]
        return LogPage(lines=lines, next_offset=nxt, complete=complete)

    async def read_logs(self, job_id: str, offset: int, limit: int) -> list[sqlite3.Row]:
        """Up to ``limit`` lines of a job from ``offset`` on."""
        return await self._all(
            "SELECT * FROM logs WHERE job_id = ? AND offset >= ? ORDER BY offset LIMIT ?",
            (job_id, offset, limit),
        )

    # -------------------------------------------------------------- metrics

    async def append_metrics(
        self, task_id: str, job_id: str, first_seq: int, points: Sequence[tuple[Any, ...]]
    ) -> int:
        """Store the points of a batch the task does not have yet (as :meth:`append_logs`).

        ``points`` are ``(rank, step, epoch, ts, metrics_json)``; returns the task's
        new point count.
        """

        def run(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                trow = conn.execute(
                    "SELECT metric_seq FROM tasks WHERE id = ?", (task_id,)
                ).fetchone()
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

        async with self._tx:
            return await self._in_thread(run)

    async def read_metrics(self, job_id: str, after: int, limit: int) -> list[sqlite3.Row]:
        """Up to ``limit`` metric points of a job with ``seq`` above ``after``."""
        return await self._all(
            "SELECT * FROM metrics WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, after, limit),
        )

    # --------------------------------------------------------------- events

    async def events_of_job(self, job_id: str) -> list[sqlite3.Row]:
        """A job's events, oldest first."""
        return await self._all("SELECT * FROM events WHERE job_id = ? ORDER BY seq", (job_id,))

    # ------------------------------------------------------------ artifacts

    async def put_artifact(self, row: dict[str, Any]) -> None:
        """Record (or replace) a job's artifact."""
        await self._write([_insert("artifacts", row, replace=True)])

    async def artifacts_of_job(self, job_id: str) -> list[sqlite3.Row]:
        """A job's artifacts by name."""
        return await self._all("SELECT * FROM artifacts WHERE job_id = ? ORDER BY name", (job_id,))

    async def get_artifact(self, job_id: str, name: str) -> sqlite3.Row | None:
        """One artifact of a job."""
        return await self._one(
            "SELECT * FROM artifacts WHERE job_id = ? AND name = ?", (job_id, name)
        )

    # -------------------------------------------------------------- workers

    async def get_worker(self, worker_id: str) -> sqlite3.Row | None:
        """One worker by id."""
        return await self._one("SELECT * FROM workers WHERE id = ?", (worker_id,))

    async def worker_by_name(self, name: str) -> sqlite3.Row | None:
        """One worker by its unique name."""
        return await self._one("SELECT * FROM workers WHERE name = ?", (name,))

    async def find_worker(self, name_or_id: str) -> sqlite3.Row:
        """A worker by name (or id), or :class:`NotFound`."""
        row = await self.worker_by_name(name_or_id) or await self.get_worker(name_or_id)
        if row is None:
            raise NotFound(f"no worker named {name_or_id!r}")
        return row

    async def list_workers(self) -> list[sqlite3.Row]:
        """All workers by name."""
        return await self._all("SELECT * FROM workers ORDER BY name")

    async def upsert_worker(self, row: dict[str, Any]) -> None:
        """Insert or replace a worker row."""
        await self._write([_insert("workers", row, replace=True)])

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

    async def set_worker_state(self, worker_id: str, state: str) -> None:
        """Move a worker to ``state``."""
        await self._write([("UPDATE workers SET state = ? WHERE id = ?", (state, worker_id))])

    # --------------------------------------------------------------- tokens

    async def insert_token(self, row: dict[str, Any]) -> None:
        """Store a token record (its hash, never the token)."""
        await self._write([_insert("tokens", row)])

    async def token_by_hash(self, digest: str) -> sqlite3.Row | None:
        """The token record with this hash."""
        return await self._one("SELECT * FROM tokens WHERE hash = ?", (digest,))

    async def token_by_id(self, token_id: str) -> sqlite3.Row | None:
        """The token record with this id."""
        return await self._one("SELECT * FROM tokens WHERE id = ?", (token_id,))

    async def list_tokens(self) -> list[sqlite3.Row]:
        """Every token record, oldest first."""
        return await self._all("SELECT * FROM tokens ORDER BY created_at, id")

    async def tokens_named(self, name: str) -> list[sqlite3.Row]:
        """The token records with this name."""
        return await self._all("SELECT * FROM tokens WHERE name = ?", (name,))

    async def revoke_tokens(self, token_ids: Sequence[str], ts: float) -> None:
        """Revoke these tokens (already revoked ones keep their time)."""
        marks = ",".join("?" * len(token_ids))
        await self._write(
            [
                (
                    f"UPDATE tokens SET revoked_at = ? WHERE id IN ({marks})"
                    " AND revoked_at IS NULL",
                    (ts, *token_ids),
                )
            ]
        )

    async def use_token(self, token_id: str, ts: float) -> bool:
        """Consume a single-use token; False when it was used (or revoked) already."""
        async with self._tx:
            cur = await self.db.execute(
                "UPDATE tokens SET used_at = ?, revoked_at = ?"
                " WHERE id = ? AND used_at IS NULL AND revoked_at IS NULL",
                (ts, ts, token_id),
            )
            n = cur.rowcount
            await cur.close()
        return n == 1

    async def worker_token_ids(self, worker_id: str) -> list[str]:
        """Ids of a worker's tokens not yet revoked."""
        rows = await self._all(
            "SELECT id FROM tokens WHERE worker_id = ? AND revoked_at IS NULL", (worker_id,)
        )
        return [r["id"] for r in rows]

    async def worker_has_bundle(self, worker_id: str, sha256: str) -> bool:
        """Whether a task placed on the worker (and not ended) has this bundle or
        function payload."""
        row = await self._one(
            "SELECT 1 FROM tasks JOIN jobs ON jobs.id = tasks.job_id"
            " WHERE tasks.worker_id = ? AND tasks.state IN ('scheduled', 'running')"
            " AND (json_extract(jobs.spec, '$.bundle') = ?"
            " OR json_extract(jobs.spec, '$.function.payload_blob') = ?) LIMIT 1",
            (worker_id, sha256, sha256),
        )
        return row is not None

    async def active_kernel_jobs(self) -> list[sqlite3.Row]:
        """Sessions and cells in a session that have not ended, oldest first."""
        return await self._all(
            "SELECT * FROM jobs WHERE state IN ('queued', 'scheduled', 'running')"
            " AND (json_extract(spec, '$.kind') = 'session'"
            " OR json_extract(spec, '$.cell.session') IS NOT NULL) ORDER BY seq"
        )

    async def worker_has_push(self, worker_id: str, sha256: str) -> bool:
        """Whether a cell placed on the worker (and not ended) pushes this blob."""
        row = await self._one(
            "SELECT 1 FROM tasks JOIN jobs ON jobs.id = tasks.job_id"
            " WHERE tasks.worker_id = ? AND tasks.state IN ('scheduled', 'running')"
            " AND json_extract(jobs.spec, '$.cell.push_blob') = ? LIMIT 1",
            (worker_id, sha256),
        )
        return row is not None

    async def revoke_worker_tokens(self, worker_id: str, ts: float) -> None:
        """Revoke every earlier token of a worker (it got a new one)."""
        await self._write(
            [
                (
                    "UPDATE tokens SET revoked_at = ? WHERE worker_id = ? AND revoked_at IS NULL",
                    (ts, worker_id),
                )
            ]
        )


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error; a constraint error is a
    :class:`~gpulayer.errors.Conflict` (runs on aiosqlite's thread)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except sqlite3.IntegrityError as e:
        conn.execute("ROLLBACK")
        raise Conflict(f"conflicts with stored data: {e}") from e
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _insert(table: str, row: dict[str, Any], *, replace: bool = False) -> tuple[str, list[Any]]:
    """An INSERT statement for ``row`` (dict values are stored as JSON)."""
    cols = list(row)
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    sql = f"{verb} INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    values = [json.dumps(v) if isinstance(v, dict | list) else v for v in row.values()]
    return sql, values


# ------------------------------------------------------ rows -> contract models


def result_statement(
    job_id: str, task_id: str, inline: bytes | None, sha256: str | None, size: int
) -> tuple[str, list[Any]]:
    """The statement that keeps a function job's result (the latest attempt's wins)."""
    row = {"job_id": job_id, "task_id": task_id, "inline": inline, "sha256": sha256, "size": size}
    return _insert("results", row, replace=True)


def as_datetime(ts: float | None) -> datetime | None:
    """A stored UNIX time as an aware UTC datetime."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def task_model(r: sqlite3.Row, names: dict[str, str] | None = None) -> Task:
    """A ``tasks`` row as a :class:`~gpulayer.contracts.Task`."""
    return Task(
        id=r["id"],
        job_id=r["job_id"],
        attempt=r["attempt"],
        state=r["state"],
        worker_id=r["worker_id"],
        worker_name=(names or {}).get(r["worker_id"]),
        gpu_indices=json.loads(r["gpu_indices"]),
        exit_code=r["exit_code"],
        reason=r["reason"],
        created_at=as_datetime(r["created_at"]),
        started_at=as_datetime(r["started_at"]),
        ended_at=as_datetime(r["ended_at"]),
        node_rank=r["node_rank"],
    )


def job_model(r: sqlite3.Row, tasks: list[sqlite3.Row], names: dict[str, str]) -> Job:
    """A ``jobs`` row (and its task rows) as a :class:`~gpulayer.contracts.Job`."""
    return Job(
        id=r["id"],
        spec=JobSpec.model_validate_json(r["spec"]),
        state=r["state"],
        reason=r["reason"],
        owner=r["owner"],
        exit_code=r["exit_code"],
        attempts=r["attempts"],
        worker_id=r["worker_id"],
        worker_name=names.get(r["worker_id"]),
        created_at=as_datetime(r["created_at"]),
        updated_at=as_datetime(r["updated_at"]),
        started_at=as_datetime(r["started_at"]),
        ended_at=as_datetime(r["ended_at"]),
        tasks=[task_model(t, names) for t in tasks],
        log_lines=r["log_count"],
    )


def worker_model(r: sqlite3.Row, running: list[str]) -> Worker:
    """A ``workers`` row as a :class:`~gpulayer.contracts.Worker`."""
    info = json.loads(r["info"])
    return Worker(
        id=r["id"],
        name=r["name"],
        hostname=r["hostname"],
        state=WorkerState(r["state"]),
        registered_at=as_datetime(r["registered_at"]),
        last_heartbeat=as_datetime(r["last_heartbeat"]),
        running_tasks=running,
        cpu_percent=r["cpu_percent"],
        memory_used_bytes=r["memory_used"],
        **info,
    )
