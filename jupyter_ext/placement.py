"""Placement: does a job fit on a worker now, could it ever, and if not, why not.

Pure functions over parsed worker views, so the scheduler's placement pass,
``GET jobs/{id}/placement`` and ``gpulayer explain`` give the same answer; the
reason strings are what users read.

A requirement is either *static* (the worker's hardware, labels or name can never
satisfy it: the job is flagged unsatisfiable there) or *dynamic* (slots or GPUs are
busy now: the job waits).

A reason names the job that holds a busy GPU only when its reader may see that
job (``label``): a submitter reads "GPU 0 busy" for another owner's job.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpulayer.contracts import (
    Device,
    Job,
    JobState,
    Placement,
    Resources,
    WorkerFit,
    WorkerState,
    compute_capability_tuple,
    gpu_model_matcher,
)

from .store import Hold, WorkerRecord

_GIB = 1024**3


@dataclass(frozen=True)
class WorkerView:
    """A worker's registration, parsed once, plus its current state."""

    id: str
    name: str
    state: WorkerState
    cpus: int
    memory_bytes: int
    slots: int
    labels: dict[str, str]
    devices: tuple[Device, ...]

    @classmethod
    def from_record(cls, row: WorkerRecord) -> "WorkerView":
        """Parse a worker's registration."""
        info = row.info
        return cls(
            id=row.id,
            name=row.name,
            state=row.state,
            cpus=info["cpus"],
            memory_bytes=info["memory_bytes"],
            slots=info["slots"],
            labels=info.get("labels", {}),
            devices=tuple(Device.model_validate(d) for d in info.get("devices", [])),
        )


@dataclass
class Usage:
    """What one worker has committed to active (scheduled or running) tasks."""

    tasks: int = 0
    gpus: dict[int, str] = field(default_factory=dict)  # GPU index -> job id


def usage_by_worker(active_tasks: Iterable[Hold]) -> dict[str, Usage]:
    """Sum the active tasks per worker id."""
    usage: dict[str, Usage] = {}
    for t in active_tasks:
        u = usage.setdefault(t.worker_id or "", Usage())
        u.tasks += 1
        for i in t.gpu_indices:
            u.gpus[i] = t.job_id
    return usage


#: How a reason names the job (by id) holding a GPU; None: it does not name it.
JobLabel = Callable[[str], str | None]


def job_label(job_id: str) -> str | None:
    """The label of a job for readers who may see every job."""
    return f"job {job_id[:6]}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _model_matches(pattern: str, name: str) -> bool:
    """``gpu_model`` against a GPU name (linear time, compiled once per pattern); a
    stored pattern the engine no longer compiles matches nothing."""
    try:
        return gpu_model_matcher(pattern)(name)
    except ValueError:
        return False


def gpu_matches(res: Resources, d: Device) -> bool:
    """True when device ``d`` satisfies every per-GPU requirement of ``res``."""
    if res.accelerator is not None and d.kind != res.accelerator:
        return False
    if res.gpu_memory is not None and d.memory_bytes < res.gpu_memory:
        return False
    if res.gpu_model is not None and not _model_matches(res.gpu_model, d.name):
        return False
    if res.gpu_memory_kind is not None and d.memory_kind != res.gpu_memory_kind:
        return False
    if res.min_compute_capability is not None:
        if d.compute_capability is None:
            return False
        want = compute_capability_tuple(res.min_compute_capability)
        if compute_capability_tuple(d.compute_capability) < want:
            return False
    return True


def describe_gpus(res: Resources) -> str:
    """``"2 × cuda GPU ≥ 40 GiB"``: the GPU part of a requirement, for reasons."""
    parts = [f"{res.gpus} ×"]
    if res.accelerator:
        parts.append(res.accelerator)
    if res.gpu_model:
        parts.append(f"/{res.gpu_model}/")
    parts.append("GPU")
    if res.gpu_memory is not None:
        parts.append(f"≥ {res.gpu_memory / _GIB:g} GiB")
    if res.min_compute_capability:
        parts.append(f"cc ≥ {res.min_compute_capability}")
    if res.gpu_memory_kind:
        parts.append(f"({res.gpu_memory_kind} memory)")
    return " ".join(parts)


def static_misfit(res: Resources, w: WorkerView) -> str | None:
    """Why ``w`` could never run a task needing ``res`` (None when it could)."""
    if res.worker is not None and w.name != res.worker:
        return f"not the requested worker {res.worker!r}"
    for key, want in res.selector.items():
        have = w.labels.get(key)
        if have != want:
            return (
                f"label {key}={want} wanted, has {key}={have}"
                if have is not None
                else f"has no label {key} (wanted {key}={want})"
            )
    if res.cpus > w.cpus:
        return f"needs {res.cpus:g} CPUs, has {w.cpus}"
    if res.memory is not None and res.memory > w.memory_bytes:
        return f"needs {res.memory / _GIB:.1f} GiB memory, has {w.memory_bytes / _GIB:.1f} GiB"
    if res.gpus:
        matching = [d for d in w.devices if gpu_matches(res, d)]
        if len(matching) < res.gpus:
            if not w.devices:
                return f"needs {describe_gpus(res)}, has no GPUs"
            if len(matching) == len(w.devices):
                return f"needs {describe_gpus(res)}, has {len(w.devices)}"
            return (
                f"needs {describe_gpus(res)}, only {len(matching)} of its"
                f" {_plural(len(w.devices), 'GPU')} match"
            )
    return None


def fit(res: Resources, w: WorkerView, usage: Usage) -> list[int] | str:
    """The GPU indices a task needing ``res`` gets on ``w`` now, or why it does not fit."""
    if w.state != WorkerState.ready:
        return "draining: takes no new tasks" if w.state == WorkerState.draining else w.state.value
    return static_misfit(res, w) or free_fit(res, w, usage)


def free_fit(
    res: Resources, w: WorkerView, usage: Usage, label: JobLabel = job_label
) -> list[int] | str:
    """:func:`fit` for a ready worker that :func:`static_misfit` already accepted
    (``label`` names the jobs holding busy GPUs in the reason)."""
    if usage.tasks >= w.slots:
        return "its only task slot is busy" if w.slots == 1 else f"all {w.slots} task slots busy"
    if not res.gpus:
        return []
    matching = [d.index for d in w.devices if gpu_matches(res, d)]
    free = [i for i in matching if i not in usage.gpus]
    if len(free) < res.gpus:
        busy = ", ".join(_busy(i, label(usage.gpus[i])) for i in matching if i in usage.gpus)
        return f"needs {describe_gpus(res)}, has {len(free)} free ({busy})"
    return free[: res.gpus]


def _busy(index: int, holder: str | None) -> str:
    return f"GPU {index} busy with {holder}" if holder else f"GPU {index} busy"


def shape(res: Resources) -> str:
    """A key equal for requirements that fit (or not) in exactly the same places."""
    return res.model_dump_json(exclude={"profile"})


def placed_report(job: Job) -> Placement:
    """The placement report of a job that is no longer queued: its worker and GPUs,
    or every node's of a distributed job (``local-1 (node 0, GPUs 0,1), local-2
    (node 1, GPUs 0,1)``)."""
    nodes = sorted(
        (t for t in job.tasks if t.attempt == job.attempts and t.node_rank is not None),
        key=lambda t: t.node_rank or 0,
    )
    if len(nodes) > 1:
        where = ", ".join(
            f"{t.worker_name or 'no worker'} (node {t.node_rank}{_gpu_text(t.gpu_indices, ', ')})"
            for t in nodes
        )
    else:
        gpus = job.tasks[-1].gpu_indices if job.tasks else []
        where = (job.worker_name or "no worker") + (f" ({_gpu_text(gpus)})" if gpus else "")
    verb = "ran on" if job.state.terminal else f"{job.state.value} on"
    return Placement(job_id=job.id, state=job.state, satisfiable=True, summary=f"{verb} {where}")


def _gpu_text(gpus: list[int], lead: str = "") -> str:
    return f"{lead}GPUs {','.join(map(str, gpus))}" if gpus else ""


def waiting_report(
    res: Resources,
    job_id: str,
    state: JobState,
    views: list[WorkerView],
    usage: dict[str, Usage],
    label: JobLabel = job_label,
) -> Placement:
    """Per worker, whether a queued job fits now, could ever fit, and why not
    (``label``: see :func:`free_fit`)."""
    if not views:
        return Placement(
            job_id=job_id,
            state=state,
            satisfiable=False,
            summary="no workers have registered; start one with `gpulayer join URL`",
        )
    fits = []
    for w in views:
        u = usage.get(w.id) or Usage()
        never = static_misfit(res, w)
        fits_now = False
        if never is not None:
            reason = never
        elif w.state != WorkerState.ready:
            reason = str(fit(res, w, u))
        else:
            now = free_fit(res, w, u, label)
            fits_now = isinstance(now, list)
            reason = now if isinstance(now, str) else "fits; waiting for the next placement pass"
        fits.append(
            WorkerFit(worker=w.name, fits=fits_now, could_ever_fit=never is None, reason=reason)
        )
    satisfiable = any(f.could_ever_fit for f in fits)
    summary = (
        "waiting for a worker to free up"
        if satisfiable
        else "unsatisfiable: no registered worker could ever run this job"
    )
    return Placement(
        job_id=job_id, state=state, satisfiable=satisfiable, summary=summary, workers=fits
    )
