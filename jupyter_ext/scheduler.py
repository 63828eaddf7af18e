"""Jobs, tasks and workers: state machines, placement, leases.

Job (and task) states::

    queued ──▶ scheduled ──▶ running ──▶ succeeded | failed | cancelled | timed_out | lost
      ▲            │            │
      └────────────┴────────────┘   retry (failed or lost, while retries remain)

A job is ``queued`` until placement gives it a task on a worker (``scheduled``);
the worker's acquire long-poll picks the task up (``running``, with a lease that
heartbeats renew). The task's end decides the job's end, or puts the job back in
the queue for another attempt. Every transition writes an event with its time and
reason, in the same transaction as the change itself.

Worker states: ``ready`` (heartbeating) → ``unhealthy`` (missed three heartbeats)
→ ``offline`` (silent for a whole lease); a heartbeat brings it back (to ``ready``,
or to ``draining`` when it was drained: it finishes its tasks and takes no new ones).
Running tasks whose lease runs out end ``lost`` (or are retried); tasks placed on a
worker that went offline before picking them up go back to the queue.

Placement order: priority (high first), then submission order. A job that does not
fit yet does not block smaller ones behind it (backfill), until it has waited
``aging_seconds``: from then on the workers that could ever run it take no job
placed after it, so it cannot starve. Among workers that fit, the one with the
fewest active tasks wins, then the name, so the same state always gives the same
placement. :meth:`Scheduler.placement` says per worker why a job waits, and flags a
job no registered worker could ever run.

Sessions (``jupyter_ext/sessions.py``): a ``session`` job is placed like any job and
holds its slot and GPUs while its kernel lives; a ``cell`` job in a session is placed
on the session's worker, with its GPUs, as soon as the session runs, and takes no
slot. Idle sessions are ended by the sweep.
"""

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from gpulayer.contracts import (
    Acquired,
    Artifact,
    Assignment,
    BlobRef,
    CreateSession,
    Event,
    Heartbeat,
    HeartbeatReply,
    Job,
    JobSpec,
    JobState,
    LogAck,
    LogBatch,
    LogPage,
    Placement,
    Registered,
    Session,
    Task,
    TaskCompletion,
    Telemetry,
    Worker,
    WorkerRegistration,
)
from gpulayer.errors import Conflict, Forbidden, InvalidTransition, NotFound, ValidationError

from . import gangs
from .artifacts import BlobStore
from .auth import Principal, TokenService
from .fleet import Fleet
from .metrics import Instruments
from .placement import (
    Usage,
    WorkerView,
    fit,
    placed_report,
    shape,
    static_misfit,
    usage_by_worker,
    waiting_report,
)
from .sessions import Sessions
from .store import Store, as_datetime, job_model, result_statement, task_model
from .streams import Notifier, job_key, logs_key, worker_key
from .transitions import TERMINAL, Statement, check, event, job_to, task_end

log = logging.getLogger("gpulayer.scheduler")

_TERMINAL = TERMINAL


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


class Scheduler:
    """The control plane's one service object; handlers only translate to it.

    Parameters
    ----------
    store, blobs, notifier, tokens
        The store, the blob directory, long-poll wake-ups and tokens.
    heartbeat_seconds, lease_seconds
        How often workers heartbeat, and how long a running task survives without one.
    aging_seconds
        How long a job may wait before nothing placed after it may pass it.
    telemetry_samples
        How many heartbeats of readings each worker keeps (a bounded window).
    clock
        Current UNIX time; tests inject their own to move time without sleeping.
    instruments
        Prometheus histograms and counters to observe (unexported ones by default).
    """

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        notifier: Notifier,
        tokens: TokenService,
        *,
        heartbeat_seconds: float = 5.0,
        lease_seconds: float = 30.0,
        aging_seconds: float = 300.0,
        telemetry_samples: int = 360,
        session_idle_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
        instruments: Instruments | None = None,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.notifier = notifier
        self.tokens = tokens
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_seconds = lease_seconds
        self.clock = clock
        # One placement or state change at a time; SQLite has one writer anyway.
        self._lock = asyncio.Lock()
        # Cancel requests not yet handed to their worker's acquire.
        self._cancels: dict[str, set[str]] = defaultdict(set)
        # Interrupts (SIGINT a cell's kernel) not yet handed to their worker: once only.
        self._interrupts: dict[str, set[str]] = defaultdict(set)
        self.aging_seconds = aging_seconds
        # Parsed once: specs never change, registrations change only on register.
        self._specs: dict[str, tuple[JobSpec, str]] = {}
        self.fleet = Fleet(store, telemetry_samples)
        self.instruments = instruments or Instruments()
        self.sessions = Sessions(self, session_idle_seconds)

    # ------------------------------------------------------------ start-up

    async def recover(self) -> None:
        """After a control-plane (re)start: give workers a lease to come back,
        and re-arm cancel requests that were not delivered yet."""
        await self.store.extend_all_leases(self.clock() + self.lease_seconds)
        for row in await self.store.active_tasks():
            if row["cancel_requested"] and row["state"] == "running":
                self._cancels[row["worker_id"]].add(row["id"])
        await self.sessions.recover()

    # ---------------------------------------------------------------- jobs

    async def submit(self, spec: JobSpec, owner: str) -> Job:
        """Queue a job and try to place it at once."""
        return (await self.submit_many([spec], owner))[0]

    async def submit_many(self, specs: Sequence[JobSpec], owner: str) -> list[Job]:
        """Queue several jobs in one transaction (all or none), then place what fits."""
        for spec in specs:
            for sha, what in ((spec.bundle, "bundle"), (_payload_blob(spec), "function payload")):
                if sha is not None and not self.blobs.exists(sha):
                    raise ValidationError(
                        f"{what} {sha} was not uploaded (POST it to /blobs first)",
                        field="bundle" if what == "bundle" else "function.payload_blob",
                    )
            push = spec.cell.push_blob if spec.cell is not None else None
            if push is not None and not self.blobs.exists(push):
                raise ValidationError(
                    f"pushed variables {push} were not uploaded (POST them to /blobs first)",
                    field="cell.push_blob",
                )
        if any(s.kind in ("cell", "session") for s in specs):
            await self.sessions.check(specs)
        now = self.clock()
        rows = []
        for spec in specs:
            job_id = _new_id()
            job = {
                "id": job_id,
                "spec": spec.model_dump_json(),
                "state": "queued",
                "reason": "waiting for placement",
                "owner": owner,
                "priority": spec.priority,
                "created_at": now,
                "updated_at": now,
            }
            why = f"submitted by {owner}"
            rows.append((job, {"job_id": job_id, "ts": now, "state": "queued", "reason": why}))
        await self.store.insert_jobs(rows)
        for spec, (job, _) in zip(specs, rows, strict=True):
            self._specs[job["id"]] = (spec, shape(spec.resources))
            if spec.kind in ("cell", "session"):
                self.sessions.submitted(job["id"], spec)
        log.info("%d job(s) queued, first %s", len(rows), rows[0][0]["id"])
        try:
            await self.schedule()
        except Exception:  # the jobs are stored and queued; the next pass places them
            log.exception("placement after submitting %s failed", rows[0][0]["id"])
        if len(rows) == 1:
            return [await self.get_job(rows[0][0]["id"])]
        return await self.jobs_by_ids([job["id"] for job, _ in rows])

    async def jobs_by_ids(self, job_ids: Sequence[str], *, with_results: bool = False) -> list[Job]:
        """Several jobs (without tasks or pending reasons), in the order of ``job_ids``."""
        rows = {r["id"]: r for r in await self.store.jobs_by_ids(job_ids)}
        names = await self._worker_names()
        jobs = [job_model(rows[i], [], names) for i in job_ids if i in rows]
        if with_results:
            results = await self.store.results([j.id for j in jobs])
            for j in jobs:
                _attach(j, results.get(j.id))
        return jobs

    async def get_job(self, job_id: str, *, with_result: bool = True) -> Job:
        """A job with its tasks, a function job's small result (and, while queued,
        why it waits)."""
        row = await self._job_row(job_id)
        tasks = await self.store.tasks_of_job(job_id)
        names = await self.fleet.names({t["worker_id"] for t in tasks} | {row["worker_id"]})
        job = job_model(row, tasks, names)
        answers = job.spec.kind in ("function", "cell", "distributed")  # kinds with a result
        if with_result and answers and job.state in _TERMINAL:
            _attach(job, await self.store.result(job_id))
        if job.state == JobState.queued:
            views = await self.fleet.views()
            report = await self._waiting(job.spec.resources, job.id, views)
            report = gangs.waiting(report, job.spec)
            job.pending_reasons = [f"{w.worker}: {w.reason}" for w in report.workers] or [
                report.summary
            ]
            if not report.satisfiable:
                job.reason = report.summary
        return job

    async def list_jobs(
        self, state: JobState | None = None, limit: int = 100, owner: str | None = None
    ) -> list[Job]:
        """Jobs newest first (only ``owner``'s when given)."""
        rows = await self.store.list_jobs(state.value if state else None, limit, owner)
        names = await self._worker_names()
        return [job_model(r, [], names) for r in rows]

    async def events(self, job_id: str) -> list[Event]:
        """Every state change of a job, oldest first."""
        await self._job_row(job_id)
        return [
            Event(
                seq=r["seq"],
                job_id=r["job_id"],
                task_id=r["task_id"],
                ts=as_datetime(r["ts"]),
                state=r["state"],
                reason=r["reason"],
            )
            for r in await self.store.events_of_job(job_id)
        ]

    async def cancel(self, job_id: str, by: str, *, reason: str | None = None) -> Job:
        """Cancel a job: at once while queued or not yet picked up, else through its worker.

        ``reason`` replaces the default "cancelled by BY".

        Raises
        ------
        InvalidTransition
            When the job already ended.
        """
        async with self._lock:
            row = await self._job_row(job_id)
            state = row["state"]
            if state in _TERMINAL:
                raise InvalidTransition(f"job {job_id} already {state}; there is nothing to cancel")
            reason = reason or f"cancelled by {by}"
            if self._spec(row)[0].kind == "session":
                self.sessions.ending.add(job_id)  # its name is free from now on
            stmts: list[tuple[str, Sequence[Any]]] = []
            wake: str | None = None
            task = await self._current_task(job_id)
            if gangs.is_gang(self._spec(row)[0]):  # every node at once
                end = gangs.cancel(self.clock(), row, await self.store.tasks_of_job(job_id), reason)
                stmts = end.statements
                self._stop(end.stop)
            elif state == "running" and task is not None and task["state"] == "running":
                if task["cancel_requested"]:
                    return await self.get_job(job_id)
                stmts.append(("UPDATE tasks SET cancel_requested = 1 WHERE id = ?", (task["id"],)))
                stmts += event(self.clock(), job_id, task["id"], "cancel_requested", reason)
                self._cancels[task["worker_id"]].add(task["id"])
                wake = task["worker_id"]
            else:
                if task is not None and task["state"] == "scheduled":
                    stmts += task_end(self.clock(), task, "cancelled", None, reason)
                stmts += job_to(self.clock(), row, "cancelled", reason, ended=True)
        if stmts:
            await self.store.apply(stmts)
        if wake:
            self.notifier.notify(worker_key(wake))
        self._notify_job(job_id)
        log.info("job %s: cancel requested", job_id)
        return await self.get_job(job_id)

    async def wait(self, job_id: str, timeout: float) -> Job | None:
        """The job once it ended, or None if it is still going after ``timeout`` s."""
        await self._job_row(job_id)

        async def ended() -> Job | None:
            row = await self.store.get_job(job_id)
            if row is not None and row["state"] in _TERMINAL:
                return await self.get_job(job_id)
            return None

        return await self.notifier.wait_for(job_key(job_id), ended, timeout)

    async def wait_any(self, job_ids: Sequence[str], timeout: float) -> list[Job] | None:
        """The jobs among ``job_ids`` that ended (with small results), as soon as at
        least one has; None if none did within ``timeout`` s."""
        unique = list(dict.fromkeys(job_ids))
        known = await self.store.jobs_by_ids(unique)
        if len(known) != len(unique):
            missing = sorted(set(unique) - {r["id"] for r in known})
            raise NotFound(f"no job with id {missing[0]!r}", field="ids")

        async def ended() -> list[Job] | None:
            rows = await self.store.jobs_by_ids(unique)
            done = [r["id"] for r in rows if r["state"] in _TERMINAL]
            return await self.jobs_by_ids(done, with_results=True) if done else None

        return await self.notifier.wait_for([job_key(i) for i in unique], ended, timeout)

    async def result(self, job_id: str) -> bytes:
        """A function job's pickled outcomes.

        Raises
        ------
        NotFound
            While the job has none (not a function job, or not ended successfully).
        """
        await self._job_row(job_id)
        row = await self.store.result(job_id)
        if row is None:
            raise NotFound(f"job {job_id} has no result (yet)")
        if row["inline"] is not None:
            return bytes(row["inline"])
        return await self.blobs.read(row["sha256"])

    async def logs(self, job_id: str, offset: int, limit: int, wait: float) -> LogPage:
        """Lines from ``offset``; waits up to ``wait`` s for the first new one."""
        await self._job_row(job_id)

        async def page(force: bool) -> LogPage | None:
            got = await self.store.log_page(job_id, offset, limit)
            return got if (got.lines or got.complete or force) else None

        if wait > 0:
            found = await self.notifier.wait_for(logs_key(job_id), lambda: page(False), wait)
            if found is not None:
                return found
        result = await page(True)
        assert result is not None
        return result

    async def artifacts(self, job_id: str) -> list[Artifact]:
        """A job's artifacts."""
        await self._job_row(job_id)
        return [
            Artifact(
                name=r["name"],
                sha256=r["sha256"],
                size=r["size"],
                created_at=as_datetime(r["created_at"]),
            )
            for r in await self.store.artifacts_of_job(job_id)
        ]

    async def artifact(self, job_id: str, name: str) -> Artifact:
        """One artifact of a job."""
        await self._job_row(job_id)
        r = await self.store.get_artifact(job_id, name)
        if r is None:
            raise NotFound(f"job {job_id} has no artifact {name!r}")
        return Artifact(
            name=r["name"],
            sha256=r["sha256"],
            size=r["size"],
            created_at=as_datetime(r["created_at"]),
        )

    # ------------------------------------------------------ cells, sessions

    async def interrupt(self, job_id: str, by: str) -> Job:
        """Interrupt a cell (SIGINT to its kernel); one not started yet is cancelled.

        Raises
        ------
        ValidationError
            When the job is not a cell.
        InvalidTransition
            When it already ended.
        """
        row = await self._job_row(job_id)
        if self._spec(row)[0].kind != "cell":
            raise ValidationError(f"job {job_id} is not a cell; cancel it instead", field="kind")
        if row["state"] in _TERMINAL:
            raise InvalidTransition(f"job {job_id} already {row['state']}; nothing to interrupt")
        task = await self._current_task(job_id)
        if row["state"] != "running" or task is None or task["state"] != "running":
            return await self.cancel(job_id, by, reason=f"interrupted by {by} before it started")
        await self.store.apply(event(self.clock(), job_id, task["id"], "interrupt_requested",
                                     f"interrupted by {by}"))  # fmt: skip
        self._interrupts[task["worker_id"]].add(task["id"])
        self.notifier.notify(worker_key(task["worker_id"]))
        log.info("job %s: interrupt requested", job_id)
        return await self.get_job(job_id)

    async def create_session(self, req: CreateSession, owner: str) -> Session:
        """Start a session: a ``session`` job placed like any other."""
        spec = JobSpec(
            kind="session",
            name=req.name,
            session={"name": req.name, "idle_timeout": req.idle_timeout},
            resources=req.resources,
            env=req.env,
            labels=req.labels,
        )
        job = await self.submit(spec, owner)
        return await self.sessions.model(await self._job_row(job.id))

    async def list_sessions(self, owner: str | None = None) -> list[Session]:
        """Sessions that have not ended (only ``owner``'s when given), oldest first."""
        rows = (await self.sessions.active()).values()
        return [await self.sessions.model(r) for r in rows if owner in (None, r["owner"])]

    async def get_session(self, name: str, owner: str | None = None) -> Session:
        """One running session."""
        return await self.sessions.model(await self.sessions.find(name, owner))

    async def end_session(self, name: str, by: str, owner: str | None = None) -> None:
        """End a session: its kernel is shut down, its slot and GPUs freed."""
        row = await self.sessions.find(name, owner)
        await self.cancel(row["id"], by, reason=f"ended by {by}")

    async def _is_session(self, job_id: str) -> bool:
        return self._spec(await self._job_row(job_id))[0].kind == "session"

    async def _kernel_job_ended(self, job_id: str) -> None:
        """Session bookkeeping once a cell or a session has ended."""
        row = await self.store.get_job(job_id)
        if row is None or row["state"] not in _TERMINAL:
            return
        spec = self._spec(row)[0]
        if spec.in_session and job_id in self.sessions.open_cells:
            self.sessions.count_cell(spec.in_session, await self.sessions.active())
            self.sessions.cell_ended(job_id)
        elif spec.kind == "session":
            self.sessions.session_ended(job_id)

    # ------------------------------------------------------------- workers

    async def workers(self) -> list[Worker]:
        """Every known worker with its running tasks and latest readings."""
        return await self.fleet.workers()

    async def register(self, reg: WorkerRegistration) -> Registered:
        """Admit a worker (new, or the same name coming back) and reconcile its tasks."""
        now = self.clock()
        async with self._lock:
            existing = await self.store.worker_by_name(reg.name)
            if (
                existing is not None
                and existing["hostname"] != reg.hostname
                and existing["state"] in ("ready", "draining")
                and (existing["last_heartbeat"] or 0) > now - 3 * self.heartbeat_seconds
            ):
                raise Conflict(
                    f"a worker named {reg.name!r} is connected from {existing['hostname']};"
                    " pick another --name",
                    field="name",
                )
            worker_id = existing["id"] if existing is not None else _new_id()
            info = reg.model_dump(
                mode="json",
                include={
                    *("cpus", "memory_bytes", "devices", "labels", "slots", "version"),
                    *("python", "address"),
                },
            )
            await self.store.upsert_worker(
                {
                    "id": worker_id,
                    "name": reg.name,
                    "hostname": reg.hostname,
                    "state": "draining"
                    if existing is not None and existing["draining"]
                    else "ready",
                    "draining": existing["draining"] if existing is not None else 0,
                    "info": info,
                    "registered_at": existing["registered_at"] if existing else now,
                    "last_heartbeat": now,
                    "cpu_percent": None,
                    "memory_used": None,
                }
            )
            await self.tokens.revoke_worker(worker_id)
            token = await self.tokens.create(f"worker:{reg.name}", "worker", worker_id=worker_id)
            kill = await self._reconcile(worker_id, reg.running_tasks, now, grace=0.0)
            for row in await self.store.active_tasks(worker_id):
                if row["cancel_requested"] and row["state"] == "running":
                    self._cancels[worker_id].add(row["id"])
        log.info("worker %s (%s) registered", reg.name, worker_id)
        await self.schedule()
        return Registered(
            worker_id=worker_id,
            token=token,
            heartbeat_seconds=self.heartbeat_seconds,
            lease_seconds=self.lease_seconds,
            kill_tasks=kill,
        )

    async def heartbeat(self, worker_id: str, hb: Heartbeat) -> HeartbeatReply:
        """Record a heartbeat, renew leases, and say which tasks to kill."""
        now = self.clock()
        row = await self._worker_row(worker_id)
        came_back = row["state"] in ("unhealthy", "offline")
        await self.store.heartbeat(worker_id, now, hb.cpu_percent, hb.memory_used_bytes)
        self.fleet.record(worker_id, now, hb)
        async with self._lock:
            kill = await self._reconcile(
                worker_id, hb.running_tasks, now, grace=2 * self.heartbeat_seconds
            )
            # Cancels that an acquire answer may have lost on the way are sent again.
            listed = set(hb.running_tasks)
            cancel = sorted(
                r["id"]
                for r in await self.store.active_tasks(worker_id)
                if r["cancel_requested"] and r["id"] in listed
            )
        if came_back:
            log.info("worker %s is back", row["name"])
            await self.schedule()
        return HeartbeatReply(kill_tasks=kill, cancel=cancel)

    async def acquire(self, worker_id: str, wait: float) -> Acquired | None:
        """New assignments and cancels for a worker; waits up to ``wait`` s for some."""
        await self._worker_row(worker_id)

        async def take() -> Acquired | None:
            async with self._lock:
                cancels = sorted(self._cancels.get(worker_id, ()))
                interrupts = sorted(self._interrupts.pop(worker_id, ()))
                rows = [
                    r for r in await self.store.active_tasks(worker_id) if r["state"] == "scheduled"
                ]
                if not rows and not cancels and not interrupts:
                    return None
                now = self.clock()
                stmts: list[tuple[str, Sequence[Any]]] = []
                out = []
                for t in rows:
                    job = await self._job_row(t["job_id"])
                    check(t["state"], "running", f"task {t['id']}")
                    self.instruments.dispatch_latency.observe(max(0.0, now - t["created_at"]))
                    stmts.append(
                        (
                            "UPDATE tasks SET state = 'running', started_at = ?, lease_expires = ?"
                            " WHERE id = ?",
                            (now, now + self.lease_seconds, t["id"]),
                        )
                    )
                    stmts += event(
                        self.clock(), t["job_id"], t["id"], "running", "picked up by worker"
                    )
                    stmts += job_to(self.clock(), job, "running", "running", started=True)
                    out.append(
                        Assignment(
                            task_id=t["id"],
                            job_id=t["job_id"],
                            attempt=t["attempt"],
                            spec=JobSpec.model_validate_json(job["spec"]),
                            gpu_indices=json.loads(t["gpu_indices"]),
                            gang=gangs.gang_of(t),
                        )
                    )
                await self.store.apply(stmts)
                self._cancels[worker_id].difference_update(cancels)  # only once stored
            for a in out:
                self._notify_job(a.job_id)
            return Acquired(assignments=out, cancel=cancels, interrupt=interrupts)

        got = await self.notifier.wait_for(worker_key(worker_id), take, wait)
        if got is not None and any(a.spec.kind == "session" for a in got.assignments):
            await self.schedule()  # the session runs now: place the cells that wait for it
        return got

    # --------------------------------------------------------------- tasks

    async def append_logs(self, principal: Principal, task_id: str, batch: LogBatch) -> LogAck:
        """Store a worker's log batch (lines it already sent are ignored)."""
        task = await self._own_task(principal, task_id)
        if task["state"] in _TERMINAL:
            raise Conflict(f"task {task_id} already {task['state']}; its logs are closed")
        n = await self.store.append_logs(
            task_id,
            task["job_id"],
            batch.seq,
            [(e.stream.value, e.ts.timestamp(), e.text, e.rank) for e in batch.lines],
        )
        self.instruments.log_lines.inc(max(0, n - task["log_seq"]))
        self.notifier.notify(logs_key(task["job_id"]))
        return LogAck(next_seq=n)

    async def add_artifact(
        self, principal: Principal, task_id: str, name: str, data: bytes
    ) -> Artifact:
        """Store a file a task produced under its job."""
        task = await self._own_task(principal, task_id)
        sha, size = await self.blobs.put(data)
        now = self.clock()
        await self.store.put_artifact(
            {"job_id": task["job_id"], "name": name, "sha256": sha, "size": size, "created_at": now}
        )
        return Artifact(name=name, sha256=sha, size=size, created_at=as_datetime(now))

    async def complete(self, principal: Principal, task_id: str, done: TaskCompletion) -> Task:
        """A worker reports a task's end; decides the job's end or its retry.

        Idempotent: a completion for a task that already ended answers the stored task.
        """
        task = await self._own_task(principal, task_id)
        if task["state"] not in _TERMINAL:
            async with self._lock:
                task = await self._task_row(task_id)
                if task["state"] not in _TERMINAL:
                    reason = done.reason
                    if done.state == "cancelled" and task["cancel_requested"]:
                        reason = await self._cancel_reason(task) or reason
                    elif task["cancel_requested"] and await self._is_session(task["job_id"]):
                        reason = await self._cancel_reason(task) or reason  # how it was ended
                    stmts = await self._finish(
                        task, done.state, done.exit_code, reason, retry=done.retry
                    )
                    if done.result is not None or done.result_blob is not None:
                        stmts.append(await self._result_statement(task, done))
                    await self.store.apply(stmts)
            log.info("task %s %s", task_id, done.state)
            await self._kernel_job_ended(task["job_id"])
            if done.state == "lost" and task["worker_id"]:
                # The worker gave the task up because it is going away: place nothing
                # more there (its next heartbeat, if any, brings it back).
                await self.store.set_worker_state(task["worker_id"], "offline")
            self._notify_job(task["job_id"])
            await self.schedule()
        return task_model(await self._task_row(task_id))

    async def add_result(self, principal: Principal, task_id: str, data: bytes) -> BlobRef:
        """Keep a function task's large result as a blob (its completion names it)."""
        task = await self._own_task(principal, task_id)
        if task["state"] in _TERMINAL:
            raise Conflict(f"task {task_id} already {task['state']}")
        sha, size = await self.blobs.put(data)
        return BlobRef(sha256=sha, size=size)

    async def _result_statement(self, task: sqlite3.Row, done: TaskCompletion) -> Statement:
        if done.result is not None:
            return result_statement(task["job_id"], task["id"], done.result, None, len(done.result))
        assert done.result_blob is not None
        if not self.blobs.exists(done.result_blob):
            raise ValidationError(
                f"result {done.result_blob} was not uploaded (PUT tasks/{{id}}/result first)",
                field="result_blob",
            )
        size = self.blobs.path(done.result_blob).stat().st_size
        return result_statement(task["job_id"], task["id"], None, done.result_blob, size)

    # ----------------------------------------------------------- placement

    async def schedule(self) -> int:
        """Place every queued job that fits; returns how many were placed.

        One pass in placement order. Requirements that failed everywhere in this
        pass are not tried again for later jobs (usage only grows within a pass),
        and the pass stops as soon as no worker has a free slot.
        """
        if not await self.store.any_queued():  # the usual case after a completion
            return 0
        async with self._lock:
            now = self.clock()
            # Cells of running sessions first: they need no slot and no GPU of their own.
            stmts, placed = await self.sessions.place_cells(now)
            workers = [w for w in await self.fleet.views() if w.state == "ready"]
            usage = await self._usage()
            free_slots = sum(max(0, w.slots - usage[w.id].tasks) for w in workers)
            failed_shapes: set[str] = set()
            reserved: set[str] = set()  # workers held for a job that waited too long
            queue = self.store.queued_jobs() if free_slots > 0 else _no_jobs()
            async for job in queue:
                if free_slots <= 0:
                    break
                spec, key = self._spec(job)
                if spec.in_session:
                    continue  # placed above, once its session runs
                key = gangs.shape_key(spec, key)
                res = spec.resources
                aged = now - job["created_at"] > self.aging_seconds
                if key in failed_shapes:
                    # It cannot fit this pass, but an aged job still holds its workers.
                    if aged:
                        reserved.update(w.id for w in workers if static_misfit(res, w) is None)
                    continue
                choice = None
                candidates = [w for w in workers if w.id not in reserved]
                if gangs.is_gang(spec):
                    nodes = gangs.choose(spec, candidates, usage)
                    if nodes is None or len(nodes) > free_slots:
                        failed_shapes.add(key)
                        if aged:
                            reserved.update(w.id for w in workers if static_misfit(res, w) is None)
                        continue
                    stmts += await self._place_gang(job, spec, nodes, now)
                    for n in nodes:
                        usage[n.worker.id].tasks += 1
                        usage[n.worker.id].gpus.update(dict.fromkeys(n.gpus, job["id"]))
                        placed.append((job["id"], n.worker.id))
                    free_slots -= len(nodes)
                    continue
                for w in sorted(candidates, key=lambda w: (usage[w.id].tasks, w.name)):
                    gpus = fit(res, w, usage[w.id])
                    if isinstance(gpus, list):
                        choice = (w, gpus)
                        break
                if choice is None:
                    failed_shapes.add(key)
                    if aged:
                        reserved.update(w.id for w in workers if static_misfit(res, w) is None)
                    continue
                w, gpus = choice
                stmts += self._place(job, w, gpus, now)
                self.instruments.placement_latency.observe(max(0.0, now - job["updated_at"]))
                usage[w.id].tasks += 1
                usage[w.id].gpus.update(dict.fromkeys(gpus, job["id"]))
                free_slots -= 1
                placed.append((job["id"], w.id))
            if stmts:
                await self.store.apply(stmts)
        for job_id, worker_id in placed:
            if worker_id:
                self.notifier.notify(worker_key(worker_id))
            self._notify_job(job_id)
        return len(placed)

    def _place(
        self, job: sqlite3.Row, w: WorkerView, gpus: list[int], now: float
    ) -> list[tuple[str, Sequence[Any]]]:
        """Statements that give ``job`` a new task on ``w`` (lock held)."""
        task_id = _new_id()
        attempt = job["attempts"] + 1
        gpu_text = f", GPUs {','.join(map(str, gpus))}" if gpus else ""
        return [
            (
                "INSERT INTO tasks (id, job_id, attempt, state, worker_id, gpu_indices,"
                " created_at) VALUES (?, ?, ?, 'scheduled', ?, ?, ?)",
                (task_id, job["id"], attempt, w.id, json.dumps(gpus), now),
            ),
            (
                "UPDATE jobs SET attempts = ?, worker_id = ? WHERE id = ?",
                (attempt, w.id, job["id"]),
            ),
            *job_to(self.clock(), job, "scheduled", f"placed on {w.name}{gpu_text}"),
        ]

    async def _place_gang(
        self, job: sqlite3.Row, spec: JobSpec, nodes: list[gangs.Node], now: float
    ) -> list[tuple[str, Sequence[Any]]]:
        """Statements that place every node of a gang (lock held)."""
        head = await self._worker_row(nodes[0].worker.id)
        address = json.loads(head["info"]).get("address") or head["hostname"]
        port = gangs.pick_port(address, gangs.busy_ports(await self.store.active_tasks()))
        return gangs.place(now, job, spec, nodes, address, port, _new_id)

    def _stop(self, stop: Sequence[tuple[str, str]]) -> None:
        """Tell workers (through their acquire long-poll) to stop these tasks."""
        for worker_id, task_id in stop:
            self._cancels[worker_id].add(task_id)
            self.notifier.notify(worker_key(worker_id))

    async def placement(self, job_id: str) -> Placement:
        """Where a job runs, or per worker why it waits (``GET jobs/{id}/placement``)."""
        row = await self._job_row(job_id)
        views = await self.fleet.views()
        if row["state"] != JobState.queued:
            names = {w.id: w.name for w in views}
            return placed_report(job_model(row, await self.store.tasks_of_job(job_id), names))
        spec = self._spec(row)[0]
        return gangs.waiting(await self._waiting(spec.resources, job_id, views), spec)

    async def _waiting(self, res: Any, job_id: str, views: list[WorkerView]) -> Placement:
        usage = await self._usage() if views else {}
        return waiting_report(res, job_id, JobState.queued, views, usage)

    def _spec(self, job: sqlite3.Row) -> tuple[JobSpec, str]:
        cached = self._specs.get(job["id"])
        if cached is None:
            spec = JobSpec.model_validate_json(job["spec"])
            cached = self._specs[job["id"]] = (spec, shape(spec.resources))
        return cached

    async def _usage(self) -> dict[str, Usage]:
        cells = self.sessions.open_cells  # they run in their session's slot and GPUs
        active = [t for t in await self.store.active_tasks() if t["job_id"] not in cells]
        return defaultdict(Usage, usage_by_worker(active))

    # -------------------------------------------------------------- leases

    async def sweep(self) -> None:
        """Mark silent workers and end (or retry) tasks whose lease ran out."""
        now = self.clock()
        changed = False
        for w in await self.store.list_workers():
            silent = now - (w["last_heartbeat"] or w["registered_at"])
            new = None
            if silent > self.lease_seconds and w["state"] != "offline":
                new = "offline"
            elif silent > 3 * self.heartbeat_seconds and w["state"] in ("ready", "draining"):
                new = "unhealthy"
            if new:
                await self.store.set_worker_state(w["id"], new)
                log.info("worker %s is %s (silent %.1fs)", w["name"], new, silent)
        async with self._lock:
            stmts: list[tuple[str, Sequence[Any]]] = []
            ended = []
            for t in await self.store.expired_leases(now):
                if t["node_rank"] is not None and t["job_id"] in ended:
                    continue  # its gang ends once, with the first node
                stmts += await self._finish(t, "lost", None, "worker stopped renewing the lease")
                ended.append(t["job_id"])
            offline = {w["id"] for w in await self.store.list_workers() if w["state"] == "offline"}
            for t in await self.store.active_tasks():
                if t["state"] == "scheduled" and t["worker_id"] in offline:
                    why = "its worker went offline before starting it"
                    if t["node_rank"] is None:
                        stmts += self._unplace(t, why)
                    elif t["job_id"] not in ended:
                        stmts += await self._finish(t, "lost", None, why)
                    ended.append(t["job_id"])
            if stmts:
                await self.store.apply(stmts)
                changed = True
        for job_id in ended:
            self._notify_job(job_id)
            await self._kernel_job_ended(job_id)
        for job_id, reason in await self.sessions.idle(now):
            log.info("session job %s: %s", job_id, reason)
            with contextlib.suppress(InvalidTransition):
                await self.cancel(job_id, by="gpulayer", reason=reason)
        if changed:
            await self.schedule()

    def _unplace(self, task: sqlite3.Row, reason: str) -> list[tuple[str, Sequence[Any]]]:
        """Statements that take back a task nobody started: the job is queued again
        and the attempt does not count (lock held)."""
        return [
            *task_end(self.clock(), task, "lost", None, reason),
            ("UPDATE jobs SET attempts = attempts - 1 WHERE id = ?", (task["job_id"],)),
            (
                "UPDATE jobs SET state = 'queued', reason = ?, updated_at = ? WHERE id = ?",
                (f"back in the queue: {reason}", self.clock(), task["job_id"]),
            ),
            *event(self.clock(), task["job_id"], None, "queued", f"back in the queue: {reason}"),
        ]

    async def _cancel_reason(self, task: sqlite3.Row) -> str | None:
        """The reason the user gave when cancelling ``task`` (e.g. "cancelled by ada")."""
        for e in reversed(await self.store.events_of_job(task["job_id"])):
            if e["task_id"] == task["id"] and e["state"] == "cancel_requested":
                return e["reason"]
        return None

    # ------------------------------------------------------------- draining

    async def drain(self, name: str, draining: bool = True) -> Worker:
        """Let a worker finish its tasks and take no new ones (or take them again)."""
        row = await self.store.find_worker(name)
        await self.store.set_draining(row["id"], draining)
        log.info("worker %s %s", row["name"], "draining" if draining else "resumed")
        if not draining:
            await self.schedule()
        return next(w for w in await self.workers() if w.id == row["id"])

    async def telemetry(self, name: str) -> Telemetry:
        """A worker's recent heartbeat readings."""
        return await self.fleet.telemetry(name)

    async def _reconcile(
        self, worker_id: str, reported: Sequence[str], now: float, grace: float
    ) -> list[str]:
        """Compare what a worker says it runs with the store (lock held).

        Returns the reported tasks the control plane no longer runs there (to kill);
        running tasks the worker no longer reports, picked up more than ``grace`` s
        ago, end as lost (or retry).
        """
        mine = {
            r["id"]: r for r in await self.store.active_tasks(worker_id) if r["state"] == "running"
        }
        listed = set(reported)
        kill = sorted(listed - set(mine))
        await self.store.renew_leases(
            worker_id, sorted(listed & set(mine)), now + self.lease_seconds
        )
        stmts: list[tuple[str, Sequence[Any]]] = []
        for tid, row in mine.items():
            if tid not in listed and (row["started_at"] or 0) < now - grace:
                stmts += await self._finish(row, "lost", None, "the worker no longer runs it")
        if stmts:
            await self.store.apply(stmts)
            for tid in mine.keys() - listed:
                self._notify_job(mine[tid]["job_id"])
        return kill

    # ------------------------------------------------------- state changes

    async def _finish(
        self,
        task: sqlite3.Row,
        state: str,
        exit_code: int | None,
        reason: str | None,
        *,
        retry: bool = True,
    ) -> list[tuple[str, Sequence[Any]]]:
        """Statements that end ``task`` and move its job on (lock held); ``retry``
        False ends the job even when attempts are left (the failure is its answer)."""
        job = await self._job_row(task["job_id"])
        spec = JobSpec.model_validate_json(job["spec"])
        reason = reason or {"succeeded": "exit code 0"}.get(state, state)
        if gangs.is_gang(spec):
            tasks = await self.store.tasks_of_job(job["id"])
            names = await self._worker_names()
            end = gangs.finish(
                self.clock(), job, spec, tasks, task, state, exit_code, reason,
                retry=retry, names=names,
            )  # fmt: skip
            self._stop(end.stop)
            return end.statements
        stmts = task_end(self.clock(), task, state, exit_code, reason)
        if retry and state in ("failed", "lost") and job["attempts"] <= spec.retries:
            left = spec.retries - job["attempts"] + 1
            stmts += job_to(
                self.clock(),
                job,
                "queued",
                f"attempt {job['attempts']} {state} ({reason}); retrying,"
                f" {left} attempt{'s' if left != 1 else ''} left",
            )
        else:
            stmts += job_to(self.clock(), job, state, reason, ended=True, exit_code=exit_code)
        return stmts

    def _notify_job(self, job_id: str) -> None:
        self.notifier.notify(job_key(job_id))
        self.notifier.notify(logs_key(job_id))

    # ---------------------------------------------------------------- rows

    async def _job_row(self, job_id: str) -> sqlite3.Row:
        row = await self.store.get_job(job_id)
        if row is None:
            raise NotFound(f"no job with id {job_id!r}")
        return row

    async def _task_row(self, task_id: str) -> sqlite3.Row:
        row = await self.store.get_task(task_id)
        if row is None:
            raise NotFound(f"no task with id {task_id!r}")
        return row

    async def _worker_row(self, worker_id: str) -> sqlite3.Row:
        row = await self.store.get_worker(worker_id)
        if row is None:
            raise NotFound(f"no worker with id {worker_id!r}; register again")
        return row

    async def _own_task(self, principal: Principal, task_id: str) -> sqlite3.Row:
        task = await self._task_row(task_id)
        if principal.role == "worker" and task["worker_id"] != principal.worker_id:
            raise Forbidden(f"task {task_id} does not run on this worker")
        return task

    async def _current_task(self, job_id: str) -> sqlite3.Row | None:
        tasks = await self.store.tasks_of_job(job_id)
        return tasks[-1] if tasks else None

    async def _worker_names(self) -> dict[str, str]:
        return {w.id: w.name for w in await self.fleet.views()}


async def _no_jobs() -> Any:
    """An empty queue (no worker has a free slot)."""
    for _ in ():
        yield


def _payload_blob(spec: JobSpec) -> str | None:
    return spec.function.payload_blob if spec.function is not None else None


def _attach(job: Job, row: sqlite3.Row | None) -> None:
    """Put a stored result on ``job``: its size, and its bytes when kept inline."""
    if row is not None:
        job.result_size = row["size"]
        job.result = bytes(row["inline"]) if row["inline"] is not None else None
