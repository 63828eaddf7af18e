"""A control plane on a real SQLite store with a clock the test moves by hand, for
service tests that need no HTTP (``async with plane_on(tmp_path) as (cp, clock)``)."""

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
        yield plane, clock
    finally:
        await store.close()
