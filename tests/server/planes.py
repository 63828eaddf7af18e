"""A control plane on a real SQLite store with a clock the test moves by hand, for
service tests that need no HTTP (``async with plane_on(tmp_path) as (cp, clock)``).

Its store refuses a state change committed while nobody holds the control plane's
lock: every test on it checks that a job's or task's state changes only under
``core.lock`` (a change committed after the lock was let go races the placement
pass; the cancel once did, and a cancelled job ran)."""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jupyter_ext.artifacts import BlobStore
from jupyter_ext.auth import TokenService
from jupyter_ext.control_plane import ControlPlane
from jupyter_ext.store import Store
from jupyter_ext.streams import Notifier

from ..support import Clock


@contextlib.asynccontextmanager
async def plane_on(folder: Path, **kw: Any) -> AsyncIterator[tuple[ControlPlane, Clock]]:
    """A :class:`ControlPlane` over ``folder/gl.db`` and ``folder/blobs``; ``kw`` go to
    the control plane (``heartbeat_seconds``, ``lease_seconds``, ...)."""
    clock = Clock()
    store = await Store(folder / "gl.db").open()
    try:
        plane = ControlPlane(
            store, BlobStore(folder / "blobs"), Notifier(), TokenService(store, clock),
            clock=clock, **kw,
        )  # fmt: skip
        _refuse_unlocked_state_changes(plane)
        yield plane, clock
    finally:
        await store.close()


#: Statements that change a job's or a task's state, or give a job a task.
_STATE_CHANGES = ("UPDATE jobs SET state", "UPDATE tasks SET state", "INSERT INTO tasks")


def _refuse_unlocked_state_changes(plane: ControlPlane) -> None:
    store, lock = plane.core.store, plane.core.lock
    apply = store.apply

    async def locked_apply(statements: Any) -> None:
        stmts = list(statements)
        changes = [sql for sql, _ in stmts if sql.startswith(_STATE_CHANGES)]
        if changes and not lock.locked():
            raise AssertionError(f"a state change committed without the lock: {changes[0]!r}")
        await apply(stmts)

    store.apply = locked_apply  # type: ignore[method-assign]
