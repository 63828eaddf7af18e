"""The connection: one SQLite file in WAL mode behind one aiosqlite connection.

One long-lived connection is the single writer; aiosqlite runs its calls in order
on its own thread. Writes that arrive while a commit is in flight share the next
commit (``commits.py``); each writer is answered once the commit holding its
statements is done. A group of a few small writes commits on the event loop's
thread instead, on the same connection, while nothing runs on aiosqlite's
thread: without fsync (WAL, ``synchronous=NORMAL``) that takes a fraction of the
hand-off (docs/adr/0139); SQLite's own checkpoint is then off and the WAL is
checkpointed every :data:`CHECKPOINT_EVERY_COMMITS` commits on a third connection
and a thread of its own, while commits go on (docs/adr/0154).
Reads of a few rows (a job, a task, a token, a page of up to
:data:`INLINE_READ_ROWS` lines) run on the event loop's thread, on a second,
read-only connection: in WAL mode a reader
never waits for the writer and sees every committed transaction, and a point
read takes tens of microseconds where a hand-off to the writer's thread and back
costs two context switches (milliseconds on a busy machine; ~20 reads a function
call, docs/channel.md). Larger reads (lists, long log pages, retention scans)
still go to the thread (``big=True``). All SQL is parameterized; rows keep times
as UNIX seconds (REAL).

A statement that fails because the disk is full, read-only or failing raises
:class:`~gpulayer.errors.StorageFull` / :class:`~gpulayer.errors.StorageError`
(the handlers answer 507 / 503 naming the cause); its transaction is rolled back,
so what was stored before stays as it was.
"""

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from gpulayer.errors import StorageError, storage_error

from .changes import (
    TRIGGERS,
    ActiveHolds,
    Journal,
    QueuedJobs,
    QueuedRef,
    TokenListener,
    notify,
    split,
)
from .commits import Outcome, Unit, commit_group
from .records import Hold, gpu_indices
from .schema import MIGRATIONS, SCHEMA_VERSION
from .writes import Statement

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Reads of at most about this many rows run on the event loop (see the docstring).
INLINE_READ_ROWS = 1000
#: A group of at most this many units, each writing at most
#: :data:`INLINE_WRITE_ROWS` rows (a ``_write``'s statements, a log or metric
#: batch's lines), commits on the event loop's thread when aiosqlite's thread is
#: idle (docs/adr/0139).
INLINE_GROUP_UNITS = 8
INLINE_WRITE_ROWS = 64
#: With commits on the loop, SQLite's own checkpoint (which may fsync) is off; the
#: WAL is checkpointed in the background after this many commits instead.
CHECKPOINT_EVERY_COMMITS = 256


class Database:
    """Lifecycle, migrations and the read/write primitives the query mixins use."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: aiosqlite.Connection | None = None
        self._reader: sqlite3.Connection | None = None  # read-only, on the loop's thread
        # One connection means one transaction at a time: writes that arrive while
        # one commits wait, and share the next commit (commits.py).
        self._waiting: list[tuple[Unit, asyncio.Future[Any], bool]] = []  # unit, writer, small
        self._committer: asyncio.Task[None] | None = None
        self._journal = Journal()
        self._thread_calls = 0  # calls handed to aiosqlite's thread, not yet answered
        self._since_checkpoint = 0  # commits since the WAL was last checkpointed
        self._commits = 0  # group commits begun and ended (see version())
        self._checkpointer: sqlite3.Connection | None = None  # on _checkpoint_thread only
        self._checkpoint_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._checkpointing: asyncio.Task[None] | None = None
        self._catch_up_due = False  # a background checkpoint ran; commits went on meanwhile
        #: The queued jobs, followed in memory (``changes.py``).
        self.queued = QueuedJobs()
        #: What the active tasks hold, followed in memory (``changes.py``).
        self.active_holds = ActiveHolds()
        #: Counts the commits that registered, renamed, forgot a worker or changed
        #: its state: views of the fleet built at the same count are current.
        self.workers_generation = 0
        self._token_listeners: list[TokenListener] = []

    async def open(self: "D") -> "D":
        """Open (creating or migrating) the database file."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Only its owner may read it (every job's env is in it), whatever the umask;
        # SQLite gives the -wal and -shm files the database file's mode.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        # Small commits run on the loop's thread on this same connection (its TEMP
        # triggers record changes), only while aiosqlite's thread is idle.
        db = await aiosqlite.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        pragmas = ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                   "wal_autocheckpoint=0")  # fmt: skip
        for pragma in pragmas:
            await db.execute(f"PRAGMA {pragma}")
        await db.execute("PRAGMA busy_timeout=5000")
        self._db = db
        try:
            await self._migrate()
            await self._follow()
            self._reader = _read_only(self.path)
            self._checkpointer = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
            self._checkpoint_thread = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="gl-checkpoint"
            )
        except BaseException:
            await self.close()
            raise
        return self

    async def _follow(self) -> None:
        """Install the change triggers and read the queue once (``changes.py``)."""
        await self.db.create_function("gl_changed", -1, self._journal.record)
        await self.db.executescript(TRIGGERS)
        rows = await self._all(
            "SELECT id, priority, seq, created_at, updated_at, owner FROM jobs"
            " WHERE state = 'queued'"
        )
        self.queued.apply([(r["id"], QueuedRef(*r)) for r in rows])
        rows = await self._all(
            "SELECT id, job_id, worker_id, gpu_indices, state FROM tasks"
            " WHERE state IN ('scheduled', 'running')"
        )
        self.active_holds.apply(
            [(r["id"], Hold(r["job_id"], r["worker_id"], gpu_indices(r["gpu_indices"]),
                            r["state"] == "scheduled"))
             for r in rows]
        )  # fmt: skip

    def version(self) -> int | None:
        """Where the file stands: rows read at one version are what the file still
        holds while the version is the same (every write of the control plane is a
        group commit, counted as it begins and as it ends). None while anything runs
        on aiosqlite's thread: a commit there may land at any moment."""
        return None if self._thread_calls else self._commits

    def on_token_change(self, listener: TokenListener) -> None:
        """Call ``listener`` with the ids of tokens whose rows a committed
        transaction changed (revoked, used, deleted, any column)."""
        self._token_listeners.append(listener)

    def _deliver(self) -> None:
        """Apply what committed transactions changed to the in-memory read models."""
        calls = self._journal.take()
        if not calls:
            return
        changes = split(calls)
        if changes.jobs:
            self.queued.apply(changes.jobs)
        if changes.holds:
            self.active_holds.apply(changes.holds)
        if changes.workers:
            self.workers_generation += 1
        if changes.tokens:
            notify(self._token_listeners, changes.tokens)

    async def close(self) -> None:
        """Close the connections (idempotent), after a checkpoint in flight."""
        if self._checkpointing is not None:
            await asyncio.wait([self._checkpointing])  # it logs its own failure
            self._checkpointing = None
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.shutdown()
            self._checkpoint_thread = None
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
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
                "BEGIN;" + MIGRATIONS[step] + f"PRAGMA user_version={step + 1};COMMIT;"
            )

    async def apply(self, statements: Sequence[Statement]) -> None:
        """Run prepared statements (from :mod:`jupyter_ext.transitions`) in one transaction."""
        await self._write(statements)

    # ------------------------------------------------------------ primitives

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._storage_errors():
            if self._reader is not None:
                row: sqlite3.Row | None = self._reader.execute(sql, params).fetchone()
                return row
            rows = await self._on_thread(self.db.execute_fetchall(sql, params))
        return next(iter(rows), None)

    async def _all(
        self, sql: str, params: Sequence[Any] = (), *, big: bool = False
    ) -> list[sqlite3.Row]:
        """Every row of ``sql``: on the loop's thread, or, ``big`` (a list, a long page,
        a scan), on the writer's thread so the loop is never held long."""
        with self._storage_errors():
            if self._reader is not None and not big:
                return self._reader.execute(sql, params).fetchall()
            return list(await self._on_thread(self.db.execute_fetchall(sql, params)))

    @contextlib.contextmanager
    def _storage_errors(self) -> Iterator[None]:
        """A full, read-only or failing disk as a :class:`StorageError` naming the file."""
        try:
            yield
        except sqlite3.Error as e:
            mapped = storage_failure(e, self.path)
            if mapped is None:
                raise
            raise mapped from e

    async def _in_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on aiosqlite's thread in one hand-off.

        A transaction of n statements through the public API costs n + 2 thread
        round trips, each a pair of context switches; this costs one
        (docs/adr/0013). It uses aiosqlite's ``_execute`` and ``_conn``, the
        primitives every public method is built on.
        """
        db = self.db
        conn = db._conn
        try:
            with self._storage_errors():
                result: T = await self._on_thread(db._execute(lambda: fn(conn)))  # type: ignore[no-untyped-call]  # aiosqlite leaves its primitive untyped
        finally:
            self._deliver()
        return result

    async def _on_thread(self, call: Awaitable[T]) -> T:
        """Await a call handed to aiosqlite's thread, counted: while one is in flight
        no commit runs on the loop's thread (the connection is used by one thread at
        a time)."""
        self._thread_calls += 1
        try:
            return await call
        finally:
            self._thread_calls -= 1

    async def _write(self, statements: Iterable[Statement]) -> None:
        """Run several statements in one transaction (all or none of them)."""
        stmts = list(statements)

        def run(conn: sqlite3.Connection) -> None:
            for sql, params in stmts:
                conn.execute(sql, params)

        await self._commit(run, small=len(stmts) <= INLINE_WRITE_ROWS)

    async def _commit(self, unit: Callable[[sqlite3.Connection], T], *, small: bool = False) -> T:
        """Run ``unit(connection)`` in a transaction and answer once it committed.

        The unit runs in the next group commit (``commits.py``): alone when no
        commit is in flight, else with every unit that arrived meanwhile, each in
        its own savepoint. Its error (a :class:`~gpulayer.errors.Conflict` for a
        constraint) rolls back its statements only. Cancelling the caller does not
        take the unit back: it commits, or fails, with its group. A group of a few
        ``small`` units (each of at most :data:`INLINE_WRITE_ROWS` rows
        written, no large read) commits on the loop's thread (docs/adr/0139).
        """
        loop = asyncio.get_running_loop()
        if small and self._alone_now(loop):
            return self._commit_alone(unit, loop)
        future: asyncio.Future[T] = loop.create_future()
        self._waiting.append((unit, future, small))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_waiting(), name="group-commit")
        return await future

    def _alone_now(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a small unit would commit alone and on the loop's thread if handed
        to the committer: nothing waits or commits, nothing runs on aiosqlite's thread,
        no checkpoint to fold back, and nothing else ready to run on the loop before
        the committer's first turn (so no other write could join its group). Then it
        commits at once, without the committer's task and the two turns of the loop
        it takes (docs/adr/0139). At most once a turn: :meth:`_commit_alone` leaves a
        callback ready, so a writer that writes again without yielding goes through
        the committer and lets the loop turn (its I/O, a checkpoint's start)."""
        ready = getattr(loop, "_ready", None)  # asyncio's queue of ready callbacks
        return (
            ready is not None
            and not ready
            and not self._waiting
            and (self._committer is None or self._committer.done())
            and self._thread_calls == 0
            and not self._catch_up_due
        )

    def _commit_alone(
        self, unit: Callable[[sqlite3.Connection], T], loop: asyncio.AbstractEventLoop
    ) -> T:
        """Commit ``unit`` now, on the loop's thread, as a group of one."""
        loop.call_soon(_turned)  # the next commit before the loop turns waits for it
        if self._since_checkpoint >= CHECKPOINT_EVERY_COMMITS:
            self._start_checkpoint()
        try:
            with self._counted_group():
                ((ok, value),) = self._commit_here([unit])
        except Exception as e:  # nothing stored
            ok, value = False, e
        if not ok:
            raise self._storage_failure_of(value)
        result: T = value
        return result

    async def _commit_waiting(self) -> None:
        """Commit what waits, a group at a time, until nothing does; start a
        checkpoint when one is due."""
        while True:
            if self._catch_up_due:
                await self._catch_up()
            elif self._since_checkpoint >= CHECKPOINT_EVERY_COMMITS:
                self._start_checkpoint()
            if not self._waiting:
                return
            group, self._waiting = self._waiting, []
            units = [unit for unit, _, _ in group]
            try:
                with self._counted_group():
                    if self._inline(group):
                        outcomes = self._commit_here(units)
                    else:
                        commit = functools.partial(commit_group, journal=self._journal, units=units)
                        outcomes = await self._in_thread(commit)
            except Exception as e:  # nothing of the group is stored: each writer hears why
                outcomes = [(False, e)] * len(group)
            for (_, future, _), (ok, value) in zip(group, outcomes, strict=True):
                if future.done():  # its writer was cancelled; its unit ran all the same
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(self._storage_failure_of(value))

    @contextlib.contextmanager
    def _counted_group(self) -> Iterator[None]:
        """One group commit, counted as it begins and as it ends (:meth:`version`) and
        towards the next checkpoint, whether it commits or fails."""
        self._commits += 1
        try:
            yield
        finally:
            self._since_checkpoint += 1
            self._commits += 1

    def _inline(self, group: Sequence[tuple[Unit, Any, bool]]) -> bool:
        """Whether a group commits on the loop's thread: a few small units, and
        aiosqlite's thread idle (docs/adr/0139)."""
        return (
            self._thread_calls == 0
            and len(group) <= INLINE_GROUP_UNITS
            and all(small for _, _, small in group)
        )

    def _commit_here(self, units: Sequence[Unit]) -> list[Outcome]:
        """Commit ``units`` on the loop's thread (no hand-off: a commit without fsync
        takes about a tenth of a millisecond, a hand-off and back several times that)."""
        try:
            with self._storage_errors():
                db = self.db  # aiosqlite's own connection, as _in_thread uses it
                return commit_group(db._conn, self._journal, units)
        finally:
            self._deliver()

    def _start_checkpoint(self) -> None:
        """Checkpoint the WAL in the background unless a checkpoint is in flight.

        A ``PASSIVE`` checkpoint takes no lock a writer or a reader waits for, so it
        runs on its own connection and thread while commits go on. It may fsync,
        which held every commit behind it for ~15 ms each 256 commits when it ran
        between groups (docs/adr/0154).
        """
        if self._checkpointer is None or (
            self._checkpointing is not None and not self._checkpointing.done()
        ):
            return
        self._since_checkpoint = 0
        self._checkpointing = asyncio.create_task(self._checkpoint(), name="wal-checkpoint")

    async def _checkpoint(self) -> None:
        """Run one ``PASSIVE`` checkpoint on the checkpoint thread; a failure is
        logged and left for the next one.

        Frames committed while it ran stay in the WAL, and SQLite starts the WAL
        over only once every frame is back in the file; so the committer folds
        those back before its next group (:meth:`_catch_up`).
        """
        if await self._run_checkpoint():
            self._catch_up_due = True

    async def _catch_up(self) -> None:
        """Fold back the frames committed during the last background checkpoint,
        with commits held (a few frames: a fraction of a millisecond), so the next
        commit starts the WAL over instead of growing it."""
        self._catch_up_due = False
        await self._run_checkpoint()

    async def _run_checkpoint(self) -> bool:
        """One ``PASSIVE`` checkpoint on the checkpoint thread: whether it ran."""
        conn = self._checkpointer
        if conn is None:  # closed meanwhile
            return False
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._checkpoint_thread, _checkpoint_wal, conn)
        except sqlite3.Error as e:
            log.warning("WAL checkpoint of %s failed: %s", self.path, e)
            return False
        return True

    def _storage_failure_of(self, e: BaseException) -> BaseException:
        """A unit's error, a failing disk's as a :class:`StorageError`."""
        if isinstance(e, sqlite3.Error):
            return storage_failure(e, self.path) or e
        return e


D = TypeVar("D", bound=Database)


def _turned() -> None:
    """Nothing: a callback whose place in the loop's ready queue says it has not
    turned since the last commit made at once (:meth:`Database._alone_now`)."""


def _checkpoint_wal(conn: sqlite3.Connection) -> None:
    """Fold what the WAL holds back into the database file (the pragma is stepped to
    its end: a statement left unfinished would hold a read of the WAL)."""
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def _read_only(path: Path) -> sqlite3.Connection:
    """The read-only connection reads of a few rows use (see the module docstring)."""
    conn = sqlite3.connect(
        path.absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None,
        check_same_thread=False,  # used on the loop's thread only; opened wherever open() ran
    )  # fmt: skip
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only=1")
    conn.execute("PRAGMA busy_timeout=1000")  # WAL readers wait only in rare recoveries
    return conn


#: SQLite's primary result codes that mean the storage, not the statement, failed.
_STORAGE_ERRNO = {
    sqlite3.SQLITE_FULL: errno.ENOSPC,
    sqlite3.SQLITE_READONLY: errno.EROFS,
    sqlite3.SQLITE_IOERR: errno.EIO,
    sqlite3.SQLITE_CANTOPEN: errno.EIO,
}


def storage_failure(e: sqlite3.Error, path: Path) -> StorageError | None:
    """The :class:`StorageError` a SQLite error stands for (None: not the storage's)."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is None or (code & 0xFF) not in _STORAGE_ERRNO:
        return None
    number = _STORAGE_ERRNO[code & 0xFF]
    return storage_error(OSError(number, os.strerror(number)), path)


def marks(values: Sequence[Any]) -> str:
    """``?, ?, ?`` for an ``IN (...)`` list of ``values``."""
    return ",".join("?" * len(values))
