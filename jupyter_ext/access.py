"""Who may see which job, task and blob: decided here, applied inside the services.

Roles decide which *routes* a principal may call (``auth.requires``); this module
decides which *things* it may touch there:

- a ``submitter`` sees only its own jobs and sessions (owner = its token's name);
  another owner's look as if they did not exist (404), so ids do not leak. In the
  fleet's listing and telemetry it sees only its own tasks (ids, CPU, memory), and
  it may name in a job only the blobs it uploaded itself;
- a ``worker`` acts only for its own worker id, on tasks placed on it, and reads
  only the bundles, payloads and pushed variables of its own active tasks;
- a ``join`` token registers only *new* worker names; registering an existing
  name again takes that worker's own token (docs/adr/0070-worker-credentials.md);
- everyone else who may call a route (``admin``, ``viewer``, the Jupyter user)
  sees everything there (a ``viewer`` is a read-only operator: the whole fleet,
  every job; see ``docs/security.md``), but a job's ``env`` *values* only for its
  owner and admins: anyone else reads the keys with :data:`REDACTED` values
  (:func:`shown`). Secrets never appear in a read at all (``secrets.py``).

A ``viewer`` argument of ``None`` is the control plane itself (the sweep, tests).
"""

from collections.abc import Iterable

from gpulayer.contracts import Job, Telemetry, Worker
from gpulayer.errors import Conflict, Forbidden, NotFound

from .auth import Principal
from .store import JobRecord, Store, TaskRecord, WorkerRecord


def owner_scope(viewer: Principal | None) -> str | None:
    """The only owner whose jobs ``viewer`` may see (None: every owner's)."""
    return viewer.name if viewer is not None and viewer.role == "submitter" else None


def may_see(viewer: Principal | None, job: JobRecord) -> bool:
    """Whether ``viewer`` may see ``job`` (and its tasks, logs, artifacts, result)."""
    owner = owner_scope(viewer)
    return owner is None or job.owner == owner


def visible_job(viewer: Principal | None, job: JobRecord | None, job_id: str) -> JobRecord:
    """``job`` when ``viewer`` may see it.

    Raises
    ------
    NotFound
        When it does not exist, or is another owner's.
    """
    if job is None or not may_see(viewer, job):
        raise NotFound(f"no job with id {job_id!r}")
    return job


def visible_jobs(
    viewer: Principal | None, jobs: Iterable[JobRecord], job_ids: Iterable[str]
) -> None:
    """Refuse ``job_ids`` unless every one exists and ``viewer`` may see it.

    Raises
    ------
    NotFound
        Naming the first id that is missing (field ``ids``).
    """
    seen = {j.id for j in jobs if may_see(viewer, j)}
    if missing := [i for i in job_ids if i not in seen]:
        raise NotFound(f"no job with id {missing[0]!r}", field="ids")


#: What a job's ``env`` value reads as for anyone but its owner and admins.
REDACTED = "***"


def shown(viewer: Principal | None, job: Job) -> Job:
    """``job`` as ``viewer`` may read it: its ``env`` values only for its owner and
    admins (and the control plane itself); others see the keys, values redacted."""
    if viewer is None or viewer.role == "admin" or viewer.name == job.owner or not job.spec.env:
        return job
    env = dict.fromkeys(job.spec.env, REDACTED)
    return job.model_copy(update={"spec": job.spec.model_copy(update={"env": env})})


def listed_owner(viewer: Principal | None, asked: str | None) -> str | None:
    """The owner filter of a job listing: a submitter's own, whatever it asked for."""
    return owner_scope(viewer) or asked


def own_worker(viewer: Principal | None, worker_id: str) -> None:
    """Refuse a worker token acting for another worker (403)."""
    if viewer is not None and viewer.role == "worker" and viewer.worker_id != worker_id:
        raise Forbidden("a worker token may only act for its own worker")


def may_register(
    who: Principal | None, name: str, existing: WorkerRecord | None, worker_id: str | None
) -> None:
    """Refuse a registration ``who`` may not make.

    Through ``workers/register`` (``worker_id`` None) a join token registers only a
    name no worker holds; through ``workers/{worker_id}/register`` a worker token
    registers only its own worker, under its own name. An admin (and the control
    plane itself) may do either for any worker.

    Raises
    ------
    Conflict
        A join token naming a registered worker, or a worker renaming itself (409,
        field ``name``).
    Forbidden
        A worker token acting for another worker, or an instance's join token naming
        another worker than its own (403).
    """
    if worker_id is None:
        bound = who.instance_worker if who is not None else None
        if bound is not None and name != bound:
            raise Forbidden(
                f"this join token belongs to a provider instance and registers only the"
                f" worker {bound!r}, not {name!r}"
            )
        if existing is not None and who is not None and who.role != "admin":
            raise Conflict(
                f"a worker named {name!r} is registered already, and a join token registers"
                " only new names; restart that worker with its data dir (it keeps its own"
                f" credential there), or have an admin run `gpulayer workers forget {name}`",
                field="name",
            )
        return
    own_worker(who, worker_id)
    if existing is None or existing.id != worker_id:
        raise Conflict(
            f"worker {worker_id} is not registered as {name!r}; a worker keeps its name",
            field="name",
        )


def own_task(viewer: Principal | None, task: TaskRecord) -> TaskRecord:
    """``task`` when ``viewer`` may report on it: a worker only on its own tasks (403)."""
    if viewer is not None and viewer.role == "worker" and task.worker_id != viewer.worker_id:
        raise Forbidden(f"task {task.id} does not run on this worker")
    return task


async def may_use_blob(store: Store, user: Principal | None, sha256: str) -> bool:
    """Whether ``user`` may name blob ``sha256`` in a job: a submitter only a blob it
    uploaded itself (an admin, the Jupyter user with its role, the control plane any)."""
    if user is None or user.role != "submitter":
        return True
    return await store.owns_blob(sha256, user.name)


async def scoped_workers(store: Store, viewer: Principal | None, workers: list[Worker]) -> None:
    """Leave in ``workers`` only the tasks ``viewer`` may see (ids and per-task
    readings); a submitter sees its own, everyone else all."""
    owner = owner_scope(viewer)
    if owner is None:
        return
    ids = [t for w in workers for t in w.running_tasks] + [
        s.task_id for w in workers for s in w.tasks
    ]
    mine = await store.owned_task_ids(owner, ids)
    for w in workers:
        w.running_tasks = [t for t in w.running_tasks if t in mine]
        w.tasks = [s for s in w.tasks if s.task_id in mine]


async def scoped_telemetry(store: Store, viewer: Principal | None, found: Telemetry) -> Telemetry:
    """``found`` with only the per-task readings ``viewer`` may see."""
    owner = owner_scope(viewer)
    if owner is None:
        return found
    mine = await store.owned_task_ids(owner, [t.task_id for s in found.samples for t in s.tasks])
    samples = [
        s.model_copy(update={"tasks": [t for t in s.tasks if t.task_id in mine]})
        for s in found.samples
    ]
    return found.model_copy(update={"samples": samples})


async def may_read_blob(store: Store, viewer: Principal | None, sha256: str) -> None:
    """Refuse a worker a blob that no active task of its own needs (403)."""
    if viewer is None or viewer.role != "worker":
        return
    wid = viewer.worker_id or ""
    if not (await store.worker_has_bundle(wid, sha256) or await store.worker_has_push(wid, sha256)):
        raise Forbidden("a worker token may only read the bundles of its own tasks")
