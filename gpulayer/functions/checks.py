"""What the workers offer a remote function: their Python versions and slots
(asked at most every 30 s per connection)."""

import time

from gpulayer import contracts, errors, payload
from gpulayer.client.connection import Connection

_WORKERS_TTL_SECONDS = 30.0

_workers_cache: dict[int, tuple[float, list[contracts.Worker]]] = {}


def _workers(conn: Connection) -> list[contracts.Worker]:
    now = time.monotonic()
    hit = _workers_cache.get(id(conn))
    if hit is None or now - hit[0] > _WORKERS_TTL_SECONDS:
        try:
            hit = (now, conn.workers())
        except errors.AuthError:  # a token that may submit but not list workers
            hit = (now, [])
        _workers_cache[id(conn)] = hit
    return hit[1]


def check_python(conn: Connection, spec: contracts.JobSpec) -> None:
    """Refuse, before submitting, when the job's env (or, without one, every live
    worker) runs another Python."""
    wanted_python = spec.environment.python if spec.environment is not None else None
    if wanted_python:
        if wanted_python != payload.PYTHON:
            raise errors.PayloadError(
                f"Python version mismatch: this process runs Python {payload.PYTHON}, the"
                f" job's environment asks for Python {wanted_python}. Pickled functions only"
                " move between the same Python minor version.",
                field="environment.python",
            )
        return
    live = [w for w in _workers(conn) if w.state in ("ready", "draining") and w.python]
    wanted = spec.resources.worker
    if wanted:
        live = [w for w in live if w.name == wanted]
    if live and all(w.python != payload.PYTHON for w in live):
        versions = ", ".join(sorted({f"{w.name}: {w.python}" for w in live}))
        raise errors.PayloadError(
            f"Python version mismatch: this process runs Python {payload.PYTHON}, the workers"
            f" run {versions}. Pickled functions only move between the same Python minor"
            " version: start the kernel (or the workers) with a matching Python, e.g. the"
            " same conda or venv.",
            field="python",
        )


def slots(conn: Connection, spec: contracts.JobSpec) -> int:
    """Slots of the ready workers (an estimate of how many calls run at once)."""
    ready = [w for w in _workers(conn) if w.state == "ready"]
    if spec.resources.worker:
        ready = [w for w in ready if w.name == spec.resources.worker]
    return sum(w.slots for w in ready)
