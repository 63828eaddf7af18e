"""Placement: does a job fit on a worker now, and if not, why not.

Pure functions over store rows, so the scheduler's placement pass and
:meth:`~jupyter_ext.scheduler.Scheduler.explain` give the same answer, and the
reason strings are what users read in ``gpulayer job ID``.
"""

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpulayer.contracts import Device, JobSpec

_GIB = 1024**3


@dataclass
class Usage:
    """What one worker has committed to active (scheduled or running) tasks."""

    tasks: int = 0
    gpus: set[int] = field(default_factory=set)


def usage_by_worker(active_tasks: Iterable[sqlite3.Row]) -> dict[str, Usage]:
    """Sum the active tasks per worker id."""
    usage: dict[str, Usage] = defaultdict(Usage)
    for t in active_tasks:
        u = usage[t["worker_id"]]
        u.tasks += 1
        u.gpus.update(json.loads(t["gpu_indices"]))
    return usage


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def fit(spec: JobSpec, worker: sqlite3.Row, usage: Usage) -> list[int] | str:
    """The GPU indices ``spec`` would get on ``worker``, or why it does not fit.

    CPUs and memory are a per-task fit check against the worker's size; slots and
    GPUs are counted against what the worker's active tasks hold.
    """
    info = json.loads(worker["info"])
    res = spec.resources
    if res.cpus > info["cpus"]:
        return f"needs {res.cpus:g} CPUs, has {info['cpus']}"
    if res.memory is not None and res.memory > info["memory_bytes"]:
        return (
            f"needs {res.memory / _GIB:.1f} GiB memory, has {info['memory_bytes'] / _GIB:.1f} GiB"
        )
    devices = [Device.model_validate(d) for d in info["devices"]]
    gpus = [d.index for d in devices if d.kind != "cpu"]
    if res.gpus > len(gpus):
        return f"needs {_plural(res.gpus, 'GPU')}, has {len(gpus)}"
    if usage.tasks >= info["slots"]:
        slots = info["slots"]
        return "its only task slot is busy" if slots == 1 else f"all {slots} task slots busy"
    free = [i for i in gpus if i not in usage.gpus]
    if res.gpus > len(free):
        return f"needs {_plural(res.gpus, 'GPU')}, has {len(free)} free"
    return free[: res.gpus]
