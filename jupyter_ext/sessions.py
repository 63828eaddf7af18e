"""Sessions: persistent remote kernels that ``%%gpulayer --session NAME`` cells share.

A session is a ``session`` job. Placement gives it a worker slot and GPUs like
any job; its task then keeps a kernel alive on that worker until the session
is ended (``DELETE sessions/{name}``, which cancels the job), has been idle for
its ``idle_timeout``, or its kernel dies. A ``cell`` job that names a session
gets no reservation of its own: it waits (queued) until the session's task
runs, then is placed on the session's worker with the session's GPUs and does
not count against the worker's slots. A cell that names a session that ended
is cancelled with a reason that says so.

Names are unique among sessions that have not ended. The bookkeeping here is
in memory (open cells, last activity) and rebuilt from the store by
:meth:`Sessions.recover` after a restart, when idle clocks start again.
"""

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpulayer.contracts import JobSpec, JobState, Session
from gpulayer.errors import Conflict, NotFound

from .store import as_datetime
from .transitions import Statement, job_to

if TYPE_CHECKING:
    from .scheduler import Scheduler

_ACTIVE = ("queued", "scheduled", "running")


class Sessions:
    """The scheduler's session bookkeeping (its lock guards the placement parts)."""

    def __init__(self, scheduler: "Scheduler", idle_seconds: float) -> None:
        self._s = scheduler
        self.idle_seconds = idle_seconds
        self.open_cells: dict[str, str] = {}  # cell job id (in a session) -> session name
        self._activity: dict[str, float] = {}  # session name -> last submit or end of a cell
        self._cells_run: dict[str, int] = {}  # session job id -> cells that ended
        # Sessions asked to end whose worker has not confirmed yet: their name is free.
        self.ending: set[str] = set()

    def _spec(self, row: sqlite3.Row) -> JobSpec:
        return self._s._spec(row)[0]

    # ------------------------------------------------------------ queries

    async def active(self) -> dict[str, sqlite3.Row]:
        """Sessions that have not ended, by name."""
        rows = await self._s.store.active_kernel_jobs()
        return {
            self._spec(r).session.name: r  # type: ignore[union-attr]
            for r in rows
            if self._spec(r).session is not None and r["id"] not in self.ending
        }

    async def recover(self) -> None:
        """Rebuild the in-memory state from the store (after a restart)."""
        now = self._s.clock()
        for r in await self._s.store.active_kernel_jobs():
            spec = self._spec(r)
            if spec.in_session:
                self.open_cells[r["id"]] = spec.in_session
            elif spec.session is not None:
                self._activity[spec.session.name] = now

    async def check(self, specs: Sequence[JobSpec]) -> None:
        """Refuse sessions whose name is taken and cells of unknown sessions.

        Raises
        ------
        Conflict
            A session of that name has not ended yet.
        NotFound
            A cell names a session that does not exist (or ended).
        """
        active = await self.active()
        new = set()
        for spec in specs:
            if spec.session is not None:
                name = spec.session.name
                if name in active or name in new:
                    raise Conflict(f"a session named {name!r} is already running", field="name")
                new.add(name)
            elif spec.in_session and spec.in_session not in active | dict.fromkeys(new):
                raise NotFound(
                    f"no session named {spec.in_session!r}; start one with POST sessions"
                    f" (or %%gpulayer --session {spec.in_session})",
                    field="cell.session",
                )

    def submitted(self, job_id: str, spec: JobSpec) -> None:
        """Note a new session or cell."""
        now = self._s.clock()
        if spec.session is not None:
            self._activity[spec.session.name] = now
        elif spec.in_session:
            self.open_cells[job_id] = spec.in_session
            self._activity[spec.in_session] = now

    def idle_timeout(self, spec: JobSpec) -> float:
        """A session's idle timeout (its own or the configured default)."""
        assert spec.session is not None
        return spec.session.idle_timeout or self.idle_seconds

    # ---------------------------------------------------------- placement

    async def place_cells(self, now: float) -> tuple[list[Statement], list[tuple[str, str]]]:
        """Statements that place the waiting cells whose session runs, and cancel
        those whose session ended (lock held). Returns them and ``(job, worker)``
        pairs to notify."""
        if not self.open_cells:
            return [], []
        rows = await self._s.store.jobs_by_ids(list(self.open_cells))
        waiting = [r for r in rows if r["state"] == "queued"]
        for r in rows:
            if r["state"] in ("succeeded", "failed", "cancelled", "timed_out", "lost"):
                self.cell_ended(r["id"])
        if not waiting:
            return [], []
        active = await self.active()
        views = {w.id: w for w in await self._s.fleet.views()}
        stmts: list[Statement] = []
        placed = []
        for job in waiting:
            name = self.open_cells[job["id"]]
            session = active.get(name)
            if session is None:
                why = f"session {name!r} has ended; start it again to run cells in it"
                stmts += job_to(now, job, "cancelled", why, ended=True)
                self.cell_ended(job["id"])
                placed.append((job["id"], ""))
                continue
            task = await self._s._current_task(session["id"])
            if session["state"] != "running" or task is None or task["state"] != "running":
                continue  # the session's kernel is still starting: the cell waits
            w = views.get(task["worker_id"])
            if w is None:
                continue
            gpus = [int(i) for i in _json_list(task["gpu_indices"])]
            stmts += self._s._place(job, w, gpus, now)
            placed.append((job["id"], w.id))
        return stmts, placed

    def cell_ended(self, job_id: str) -> None:
        """A cell in a session ended: its session was active just now."""
        name = self.open_cells.pop(job_id, None)
        if name is not None:
            self._activity[name] = self._s.clock()

    def session_ended(self, job_id: str) -> None:
        """Forget what was counted for an ended session."""
        self._cells_run.pop(job_id, None)
        self.ending.discard(job_id)

    def count_cell(self, session: str, active: dict[str, sqlite3.Row]) -> None:
        """One more cell of ``session`` ended."""
        row = active.get(session)
        if row is not None:
            self._cells_run[row["id"]] = self._cells_run.get(row["id"], 0) + 1

    async def idle(self, now: float) -> list[tuple[str, str]]:
        """``(job id, reason)`` of running sessions idle past their timeout."""
        busy = set(self.open_cells.values())
        out = []
        for name, row in (await self.active()).items():
            if row["state"] != "running" or name in busy:
                continue
            timeout = self.idle_timeout(self._spec(row))
            since = max(self._activity.get(name, now), row["started_at"] or now)
            if now - since > timeout:
                out.append((row["id"], f"ended after {_human(timeout)} without a cell"))
        return out

    # ------------------------------------------------------------- models

    async def model(self, row: sqlite3.Row) -> Session:
        """The :class:`~gpulayer.contracts.Session` of a session job row."""
        spec = self._spec(row)
        assert spec.session is not None
        task = await self._s._current_task(row["id"])
        names = await self._s._worker_names()
        last = self._activity.get(spec.session.name)
        return Session(
            name=spec.session.name,
            job_id=row["id"],
            state=JobState(row["state"]),
            reason=row["reason"],
            owner=row["owner"],
            worker_name=names.get(row["worker_id"]),
            gpu_indices=[] if task is None else _json_list(task["gpu_indices"]),
            idle_timeout=self.idle_timeout(spec),
            created_at=as_datetime(row["created_at"]),
            started_at=as_datetime(row["started_at"]),
            last_activity=as_datetime(last) if row["state"] == "running" else None,
            cells=self._cells_run.get(row["id"], 0),
        )

    async def find(self, name: str, owner: str | None = None) -> sqlite3.Row:
        """The running session ``name`` (only ``owner``'s when given).

        Raises
        ------
        NotFound
            When there is none.
        """
        row = (await self.active()).get(name)
        if row is None or (owner is not None and row["owner"] != owner):
            raise NotFound(f"no session named {name!r}")
        return row


def _json_list(text: str) -> list[Any]:
    value = json.loads(text)
    return value if isinstance(value, list) else []


def _human(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
