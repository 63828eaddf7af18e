"""Gangs: the tasks of a distributed job, placed, stopped and ended together.

A distributed job (``kind: distributed``) with ``nodes = N`` gets N tasks in one
placement pass or none at all, so a half-placed gang never holds slots or GPUs
while it waits for the rest. Each node goes to a different worker, except when
the job pins one worker (``resources.worker``): then all its nodes may share it
(handy for a laptop, and for tests). Node 0's worker hosts the static rendezvous:
its advertised ``address`` and a port picked here form ``MASTER_ADDR`` and
``MASTER_PORT`` for every node (:class:`~gpulayer.contracts.Gang`).

Ends are all-or-nothing too: the job succeeds once every node succeeded; the first
node that fails (or is lost, times out, is cancelled) ends the job with that
node's reason, and every other node of the attempt ends ``cancelled`` at once, in
the same transaction, so their reservations are free for the next placement pass;
their workers hear of it through the acquire long-poll and stop the processes.
"""

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulayer.contracts import Gang, JobKind, JobSpec, JobState, Placement

from .placement import Usage, WorkerView, fit
from .store import ACTIVE_STATES, JobRecord, Statement, TaskRecord
from .transitions import job_to, placed, retry_or_end, task_end

#: Ports the rank-0 node's rendezvous may use; a random free-looking one is picked
#: so that a port still held by a gang that just ended is unlikely to come back.
PORT_RANGE = (29500, 31499)


def is_gang(spec: JobSpec) -> bool:
    """Whether ``spec`` is placed as a gang."""
    return spec.kind == JobKind.distributed


def shape_key(spec: JobSpec, key: str) -> str:
    """A placement-shape key that tells gangs of different sizes apart."""
    return f"{key}|nodes={spec.nodes}" if is_gang(spec) else key


@dataclass(frozen=True)
class Node:
    """Where one node of a gang goes."""

    worker: WorkerView
    gpus: list[int]


def choose(
    spec: JobSpec, workers: Sequence[WorkerView], usage: dict[str, Usage]
) -> list[Node] | None:
    """A worker (and GPUs) for every node of ``spec``, or None when not all fit now.

    Nodes go to the least busy workers first (then by name), one per worker unless
    the job pins a worker. ``usage`` is not changed.
    """
    res = spec.resources
    shared = res.worker is not None
    trial = {w.id: Usage(usage[w.id].tasks, dict(usage[w.id].gpus)) for w in workers}
    nodes: list[Node] = []
    taken: set[str] = set()
    for _ in range(spec.nodes):
        for w in sorted(workers, key=lambda w: (trial[w.id].tasks, w.name)):
            if w.id in taken and not shared:
                continue
            gpus = fit(res, w, trial[w.id])
            if isinstance(gpus, list):
                nodes.append(Node(w, gpus))
                trial[w.id].tasks += 1
                trial[w.id].gpus.update(dict.fromkeys(gpus, "gang"))
                taken.add(w.id)
                break
        else:
            return None
    return nodes


def busy_ports(active_tasks: Sequence[TaskRecord]) -> set[tuple[str, int]]:
    """``(address, port)`` of the rendezvous of every active gang."""
    out = set()
    for t in active_tasks:
        if t.gang_json:
            g = json.loads(t.gang_json)
            out.add((g["master_addr"], g["master_port"]))
    return out


def pick_port(address: str, busy: set[tuple[str, int]], ports: Sequence[int] | None = None) -> int:
    """A rendezvous port on ``address`` that no active gang uses, in ``ports`` (the
    worker's ``rendezvous_ports``, else :data:`PORT_RANGE`)."""
    lo, hi = ports or PORT_RANGE
    for _ in range(100):
        port = random.randint(lo, hi)  # spreading ports, not a secret
        if (address, port) not in busy:
            return port
    free = [p for p in range(lo, hi + 1) if (address, p) not in busy]
    if free:  # a narrow range, nearly full
        return free[0]
    raise RuntimeError(f"no free rendezvous port on {address} in {lo}-{hi}")


def place(
    now: float,
    job: JobRecord,
    spec: JobSpec,
    nodes: list[Node],
    address: str,
    port: int,
    new_id: Callable[[], str],
) -> list[Statement]:
    """Statements that give ``job`` one scheduled task per node (lock held)."""
    tasks = []
    for rank, node in enumerate(nodes):
        gang = Gang(
            node_rank=rank,
            nnodes=spec.nodes,
            nproc_per_node=spec.nproc_per_node,
            master_addr=address,
            master_port=port,
        )
        tasks.append((new_id(), node.worker.id, node.gpus, rank, gang.model_dump_json()))
    where = ", ".join(
        f"{n.worker.name}" + (f" (GPUs {','.join(map(str, n.gpus))})" if n.gpus else "")
        for n in nodes
    )
    why = f"gang of {spec.nodes} placed on {where}; rendezvous {address}:{port}"
    return placed(now, job, tasks, why)


def gang_of(task: TaskRecord) -> Gang | None:
    """The rendezvous stored with a task (None for a task of another kind)."""
    return Gang.model_validate_json(task.gang_json) if task.gang_json else None


@dataclass
class GangEnd:
    """What ending one task of a gang does: statements, and running peers to stop."""

    statements: list[Statement]
    stop: list[tuple[str, str]]  # (worker_id, task_id)


def finish(
    now: float,
    job: JobRecord,
    spec: JobSpec,
    tasks: Sequence[TaskRecord],
    task: TaskRecord,
    state: JobState,
    exit_code: int | None,
    reason: str,
    *,
    retry: bool,
    names: dict[str, str],
) -> GangEnd:
    """End ``task``; end its job and stop its peers as the gang's rules say (lock held).

    ``tasks`` are every task of the job (as stored now).
    """
    stmts = task_end(now, task, state, exit_code, reason)
    current = task.attempt == job.attempts and job.state in ACTIVE_STATES
    if not current:  # the gang already ended (or moved on to another attempt)
        return GangEnd(stmts, [])
    peers = [t for t in tasks if t.attempt == task.attempt and t.id != task.id]
    if state == JobState.succeeded:
        if all(t.state == JobState.succeeded for t in peers):
            stmts += job_to(now, job, JobState.succeeded, "every node exited 0", exit_code=0)
        return GangEnd(stmts, [])
    node = f"node {task.node_rank} on {names.get(task.worker_id or '', task.worker_id)}"
    why = f"{node}: {reason}"
    end = _stop_active(now, peers, f"gang stopped: {why}")
    stmts += end.statements
    stmts += retry_or_end(now, job, spec.retries, state, exit_code, why, retry=retry)
    return GangEnd(stmts, end.stop)


def _stop_active(now: float, tasks: Sequence[TaskRecord], reason: str) -> GangEnd:
    """End every active task of ``tasks`` ``cancelled``; the running ones are to stop."""
    stmts: list[Statement] = []
    stop = []
    for t in tasks:
        if t.state in ACTIVE_STATES:
            stmts += task_end(now, t, JobState.cancelled, None, reason)
            if t.state == JobState.running and t.worker_id is not None:
                stop.append((t.worker_id, t.id))
    return GangEnd(stmts, stop)


def cancel(now: float, job: JobRecord, tasks: Sequence[TaskRecord], reason: str) -> GangEnd:
    """Cancel a whole gang at once: every active node ends ``cancelled`` (lock held)."""
    end = _stop_active(now, tasks, reason)
    end.statements += job_to(now, job, JobState.cancelled, reason)
    return end


def waiting(report: Placement, spec: JobSpec) -> Placement:
    """A queued gang's placement report: the per-worker reasons, and a summary that
    counts the workers a gang of ``spec.nodes`` needs."""
    if not is_gang(spec) or not report.workers:
        return report
    shared = spec.resources.worker is not None
    need = 1 if shared else spec.nodes
    ever = sum(w.could_ever_fit for w in report.workers)
    now = sum(w.fits for w in report.workers)
    if ever < need:
        summary = (
            f"unsatisfiable: a gang of {spec.nodes} nodes needs {need} workers that could"
            f" run a node, {ever} registered could"
        )
        return report.model_copy(update={"satisfiable": False, "summary": summary})
    summary = (
        f"gang of {spec.nodes} nodes waits until all fit at once: {now} of {need}"
        f" worker{'s' if need != 1 else ''} fit now"
    )
    return report.model_copy(update={"summary": summary})
