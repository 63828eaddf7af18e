"""Group commits: the writes that arrive while a commit is in flight share the next one.

Every write of the store is a *unit*: a function of the connection that runs its
statements (and may read inside the transaction). A writer hands its unit to
:meth:`~jupyter_ext.store.db.Database._commit` and waits. While no commit is in
flight the unit goes to SQLite's thread at once, alone; while one is, units
queue, and the next hand-off runs all of them in one transaction
(:func:`commit_group`), each in a savepoint of its own, and commits once. Each
writer is answered after that COMMIT, never before (docs/adr/0112): what it was
told is stored is on disk in the WAL.

A unit that fails (a constraint, a bug) is rolled back to its savepoint alone and
its writer gets the error; the others commit. When SQLite rolls back the whole
transaction (a full disk) or the COMMIT fails, every writer of the group gets the
error, and nothing of the group is stored.
"""

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from gpulayer.errors import Conflict

from .changes import Journal

#: A write: runs its statements on the connection, inside a transaction it does not own.
Unit = Callable[[sqlite3.Connection], Any]
#: A unit's outcome: ``(True, its value)`` or ``(False, the exception it raised)``.
Outcome = tuple[bool, Any]


def commit_group(
    conn: sqlite3.Connection, journal: Journal, units: Sequence[Unit]
) -> list[Outcome]:
    """Run ``units`` in one ``BEGIN IMMEDIATE ... COMMIT`` (on aiosqlite's thread).

    ``journal`` keeps the changes of the units that were not rolled back, and only
    once the COMMIT succeeded. A constraint error of a unit is a
    :class:`~gpulayer.errors.Conflict`.

    Raises
    ------
    sqlite3.Error
        When the transaction as a whole could not be kept (every unit failed).
    """
    journal.rollback()
    conn.execute("BEGIN IMMEDIATE")
    outcomes: list[Outcome] = []
    try:
        for unit in units:
            outcomes.append(_run_unit(conn, journal, unit, alone=len(units) == 1))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            conn.execute("ROLLBACK")
        journal.rollback()
        raise
    journal.commit()
    return outcomes


def _run_unit(conn: sqlite3.Connection, journal: Journal, unit: Unit, *, alone: bool) -> Outcome:
    """One unit in its savepoint (none needed when it is the only one: a failure
    then rolls back the transaction, which holds nothing else)."""
    mark = journal.mark()
    if not alone:
        conn.execute("SAVEPOINT unit")
    try:
        value = unit(conn)
    except Exception as e:
        failure = _conflict(e) if isinstance(e, sqlite3.IntegrityError) else e
        if alone or not conn.in_transaction:
            # Alone, commit_group rolls back; out of a transaction, SQLite rolled
            # back the whole of it (a full disk): the group fails.
            if failure is e:
                raise
            raise failure from e
        conn.execute("ROLLBACK TO unit")
        conn.execute("RELEASE unit")
        journal.rollback_to(mark)
        return False, failure
    if not alone:
        conn.execute("RELEASE unit")
    return True, value


def _conflict(e: sqlite3.IntegrityError) -> Conflict:
    conflict = Conflict(f"conflicts with stored data: {e}")
    conflict.__cause__ = e
    return conflict
