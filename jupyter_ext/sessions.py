"""Sessions: persistent remote kernels that ``%%gpulayer --session NAME`` cells share.

A session is a ``session`` job. Placement gives it a worker slot and GPUs like
any job; its task then keeps a kernel alive on that worker until the session
is ended (``DELETE sessions/{name}``, which cancels the job), has been idle for
its ``idle_timeout``, or its kernel dies. A ``cell`` job that names a session
gets no reservation of its own: it waits (queued) until the session's task
runs, then is placed on the session's worker with the session's GPUs and does
not count against the worker's slots. A cell that names a session that ended
is cancelled with a reason that says so.

Names are per owner: two owners may each have a session ``main``, and neither
can see, probe or run cells in the other's (a cell names a session of its own
job's owner; the worker keys kernels by owner too). A name is unique among one
owner's sessions that have not ended. The bookkeeping here is in memory (open
cells, last activity) and rebuilt from the store by :meth:`Sessions.recover`
after a restart, when idle clocks start again.
"""

from collections.abc import Sequence
from typing import Protocol

from gpulayer.contracts import CreateSession, Job, JobKind, JobSpec, JobState, Session
from gpulayer.errors import Conflict, NotFound

from . import access
from .auth import Principal
from .core import Core, new_id
from .placement import WorkerView
from .store import JobRecord, Statement, as_datetime, as_optional_datetime
from .transitions import job_to, placed_on

#: A session: ``(owner, name)``.
Key = tuple[str, str]


class Sessions:
    """Session bookkeeping (the core's lock guards the placement parts)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.idle_seconds = core.settings.session_idle_seconds
        self.open_cells: dict[str, Key] = {}  # cell job id (in a session) -> its session
        # The job ids of the sessions that may not have ended (None: not read yet):
        # reading them by id costs the same whatever else is queued or running.
        self._session_ids: set[str] | None = None
        # Open cell -> the job id of the session it was submitted to (when it ran then):
        # its end and its output's masks need no read of every session.
        self._session_job: dict[str, str] = {}
        self._activity: dict[Key, float] = {}  # session -> last submit or end of a cell
        self._cells_run: dict[str, int] = {}  # session job id -> cells that ended
        # Sessions asked to end whose worker has not confirmed yet: their name is free.
        self.ending: set[str] = set()
        # Kernels (relay sessions) running code now: never idle (jupyter_ext/kernel_relays.py).
        self._busy: set[Key] = set()

    def _spec(self, row: JobRecord) -> JobSpec:
        return self._core.spec(row)

    # ------------------------------------------------------------ queries

    async def active(self, running_only: bool = False) -> dict[Key, JobRecord]:
        """Sessions that have not ended (or are running), by owner and name: read by
        id (every cell's submit asks), never by a scan of the jobs queued or running
        beside them."""
        ids = self._session_ids
        if ids is None:
            ids = self._session_ids = {
                r.id for r in await self._core.store.active_kernel_jobs()
                if self._spec(r).session is not None
            }  # fmt: skip
        found = await self._core.store.jobs_by_ids(sorted(ids)) if ids else []
        rows = [r for r in found if not r.ended]
        ids.intersection_update(r.id for r in rows)  # forget the ended and the deleted
        out = {}
        for r in sorted(rows, key=lambda r: r.seq):
            if running_only and r.state != JobState.running:
                continue
            session = self._spec(r).session
            if session is not None and r.id not in self.ending:
                out[r.owner, session.name] = r
        return out

    async def recover(self) -> None:
        """Rebuild the in-memory state from the store (after a restart)."""
        now = self._core.clock()
        sessions: dict[Key, str] = {}
        for r in await self._core.store.active_kernel_jobs():
            spec = self._spec(r)
            if spec.in_session:
                self.open_cells[r.id] = (r.owner, spec.in_session)
            elif spec.session is not None:
                self._activity[r.owner, spec.session.name] = now
                sessions[r.owner, spec.session.name] = r.id
        self._session_ids = set(sessions.values())
        for cell, key in self.open_cells.items():
            if key in sessions:
                self._session_job[cell] = sessions[key]

    async def check(self, specs: Sequence[JobSpec], owner: str) -> dict[Key, JobRecord]:
        """Refuse ``owner``'s sessions whose name it already uses, and its cells in
        sessions it does not have (another owner's session of that name does not count).
        Answers the sessions that have not ended, as :meth:`active` (read once).

        Raises
        ------
        Conflict
            A session of that name of this owner has not ended yet.
        NotFound
            A cell names a session that does not exist (or ended, or is another's).
        """
        active = await self.active()
        new = set()
        for spec in specs:
            if spec.session is not None:
                name = spec.session.name
                if (owner, name) in active or name in new:
                    raise Conflict(f"a session named {name!r} is already running", field="name")
                new.add(name)
            elif spec.in_session and (row := active.get((owner, spec.in_session))) is not None:
                relayed = self._spec(row).session
                if relayed is not None and relayed.relay:
                    raise Conflict(
                        f"session {spec.in_session!r} is a gpulayer kernel (its Jupyter channels"
                        " are relayed to one client): it runs no cells; open it in Jupyter",
                        field="cell.session",
                    )
            elif spec.in_session and (owner, spec.in_session) not in active:
                if spec.in_session in new:
                    continue
                raise NotFound(
                    f"no session named {spec.in_session!r}; start one with POST sessions"
                    f" (or %%gpulayer --session {spec.in_session})",
                    field="cell.session",
                )
        return active

    def submitted(
        self, job_id: str, spec: JobSpec, owner: str, active: dict[Key, JobRecord] | None = None
    ) -> None:
        """Note a new session or cell of ``owner`` (``active``: the sessions as its
        submit's :meth:`check` read them)."""
        now = self._core.clock()
        if spec.session is not None:
            self._activity[owner, spec.session.name] = now
            if self._session_ids is not None:
                self._session_ids.add(job_id)
        elif spec.in_session:
            key = (owner, spec.in_session)
            self.open_cells[job_id] = key
            self._activity[key] = now
            if active is not None and (session := active.get(key)) is not None:
                self._session_job[job_id] = session.id

    def submitted_to(self, cell_job_id: str) -> str | None:
        """The id of the session a cell was submitted to, while the cell is open."""
        return self._session_job.get(cell_job_id)

    async def session_of(self, cell_job_id: str, key: Key) -> JobRecord | None:
        """The session a cell of session ``key`` runs in: the one it was submitted to,
        else the one of that name now."""
        known = self.submitted_to(cell_job_id)
        if known is not None:
            row = await self._core.store.get_job(known)
            if row is not None:
                return row
        return (await self.active()).get(key)

    def touch(self, key: Key) -> None:
        """Session ``key`` was used just now (a kernel's client sent a message)."""
        self._activity[key] = self._core.clock()

    def kernel_state(self, key: Key, *, busy: bool) -> None:
        """A kernel started (``busy``) or stopped running code; either is activity."""
        self.touch(key)
        if busy:
            self._busy.add(key)
        else:
            self._busy.discard(key)

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
        rows = await self._core.store.jobs_by_ids(list(self.open_cells))
        waiting = [r for r in rows if r.state == JobState.queued]
        for r in rows:
            if r.ended:
                self.cell_ended(r.id)
        if not waiting:
            return [], []
        active = await self.active()
        stmts: list[Statement] = []
        out = []
        for job in waiting:
            got = await self._place_cell(now, job, active)
            if got is not None:
                stmts += got[0]
                out.append((job.id, got[1]))
        return stmts, out

    async def _place_cell(
        self, now: float, job: JobRecord, active: dict[Key, JobRecord]
    ) -> tuple[list[Statement], str] | None:
        """One waiting cell: placed on its session's worker (with its GPUs), cancelled
        when the session ended, or None while the session's kernel is starting."""
        key = self.open_cells[job.id]
        name = key[1]
        if key not in active:
            why = f"session {name!r} has ended; start it again to run cells in it"
            self.cell_ended(job.id)
            return job_to(now, job, JobState.cancelled, why), ""
        spot = await self.warm_spot(key, active)
        if spot is None:
            return None
        w, gpus = spot
        return placed_on(now, job, new_id(), w.id, w.name, gpus), w.id

    async def warm_spot(
        self, key: Key, active: dict[Key, JobRecord] | None = None
    ) -> tuple[WorkerView, list[int]] | None:
        """The worker and GPUs of session ``key`` while its kernel runs (its cells go
        there), else None."""
        session = (active if active is not None else await self.active()).get(key)
        if session is None or session.state != JobState.running:
            return None
        task = await self._core.current_task(session.id)
        if task is None or task.state != JobState.running:
            return None
        views = {w.id: w for w in await self._core.fleet.views()}
        w = views.get(task.worker_id or "")
        return None if w is None else (w, list(task.gpu_indices))

    def end_requested(self, job_id: str) -> None:
        """A session was asked to end: its name is free from now on."""
        self.ending.add(job_id)

    def cell_ended(self, job_id: str) -> None:
        """A cell in a session ended: its session was active just now."""
        key = self.open_cells.pop(job_id, None)
        self._session_job.pop(job_id, None)
        if key is not None:
            self._activity[key] = self._core.clock()

    def session_ended(self, job_id: str) -> None:
        """Forget what was counted for an ended session."""
        self._cells_run.pop(job_id, None)
        self.ending.discard(job_id)

    def count_cell(self, session_job_id: str) -> None:
        """One more cell of the session ``session_job_id`` ended."""
        self._cells_run[session_job_id] = self._cells_run.get(session_job_id, 0) + 1

    async def job_ended(self, job_id: str) -> None:
        """Bookkeeping once a cell or a session may have ended."""
        row = await self._core.store.get_job(job_id)
        if row is None or not row.ended:
            return
        spec = self._spec(row)
        if spec.in_session and job_id in self.open_cells:
            known = self._session_job.get(job_id)
            if known is None:
                session = (await self.active()).get(self.open_cells[job_id])
                known = None if session is None else session.id
            if known is not None:
                self.count_cell(known)
            self.cell_ended(job_id)
        elif spec.kind == JobKind.session:
            self.session_ended(job_id)

    async def idle(self, now: float) -> list[tuple[str, str]]:
        """``(job id, reason)`` of running sessions idle past their timeout."""
        busy = set(self.open_cells.values()) | self._busy
        out = []
        for key, row in (await self.active(running_only=True)).items():
            if row.state != JobState.running or key in busy:
                continue
            spec = self._spec(row)
            timeout = self.idle_timeout(spec)
            since = max(self._activity.get(key, now), row.started_at or now)
            if now - since > timeout:
                unused = "without use" if spec.session and spec.session.relay else "without a cell"
                out.append((row.id, f"ended after {_human(timeout)} {unused}"))
        return out

    # ------------------------------------------------------------- models

    async def model(self, row: JobRecord) -> Session:
        """The :class:`~gpulayer.contracts.Session` of a session job."""
        spec = self._spec(row)
        assert spec.session is not None
        task = await self._core.current_task(row.id)
        names = await self._core.fleet.all_names()
        last = self._activity.get((row.owner, spec.session.name))
        running = row.state == JobState.running
        return Session(
            name=spec.session.name,
            job_id=row.id,
            state=row.state,
            reason=row.reason,
            owner=row.owner,
            worker_name=names.get(row.worker_id or ""),
            gpu_indices=[] if task is None else list(task.gpu_indices),
            idle_timeout=self.idle_timeout(spec),
            created_at=as_datetime(row.created_at),
            started_at=as_optional_datetime(row.started_at),
            last_activity=as_optional_datetime(last) if running else None,
            cells=self._cells_run.get(row.id, 0),
            secrets=list(spec.secrets),
        )

    async def find(
        self, name: str, viewer: Principal | None = None, owner: str | None = None
    ) -> JobRecord:
        """The running session ``name`` of ``owner`` (default: ``viewer``'s own), as
        ``viewer`` may see it: only an admin or a viewer may name another owner.

        Raises
        ------
        NotFound
            When there is none (or it is another owner's and ``viewer`` is a submitter).
        """
        who = owner if owner is not None else (viewer.name if viewer is not None else None)
        row = None if who is None else (await self.active()).get((who, name))
        if row is None or not access.may_see(viewer, row):
            raise NotFound(f"no session named {name!r}")
        return row


class JobControl(Protocol):
    """What the session service needs of the job service."""

    async def submit(self, spec: JobSpec, owner: str) -> Job:
        """Queue a job."""
        ...

    async def cancel(self, job_id: str, by: str, *, reason: str | None = None) -> Job:
        """Cancel a job."""
        ...


class SessionService:
    """``sessions`` routes: start, list, read and end sessions."""

    def __init__(self, core: Core, sessions: Sessions, jobs: JobControl) -> None:
        self._core = core
        self._sessions = sessions
        self._jobs = jobs

    async def create(self, req: CreateSession, owner: str) -> Session:
        """Start a session: a ``session`` job placed like any other."""
        spec = JobSpec.model_validate(
            {
                "kind": "session",
                "name": req.name,
                "session": {"name": req.name, "idle_timeout": req.idle_timeout},
                "resources": req.resources,
                "env": req.env,
                "labels": req.labels,
                "api_access": req.api_access,
                "secrets": req.secrets,
                "environment": req.environment,
            }
        )
        job = await self._jobs.submit(spec, owner)
        return await self._sessions.model(await self._core.job(job.id))

    async def running(self, viewer: Principal | None = None) -> list[Session]:
        """Sessions that have not ended (as ``viewer`` may see them), oldest first."""
        rows = (await self._sessions.active()).values()
        return [await self._sessions.model(r) for r in rows if access.may_see(viewer, r)]

    async def get(
        self, name: str, viewer: Principal | None = None, owner: str | None = None
    ) -> Session:
        """One running session (``viewer``'s own unless ``owner`` is named)."""
        return await self._sessions.model(await self._sessions.find(name, viewer, owner))

    async def end(
        self, name: str, by: str, viewer: Principal | None = None, owner: str | None = None
    ) -> None:
        """End a session: its kernel is shut down, its slot and GPUs freed."""
        row = await self._sessions.find(name, viewer, owner)
        await self._jobs.cancel(row.id, by, reason=f"ended by {by}")


def _human(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
