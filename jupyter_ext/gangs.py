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
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulayer.contracts import Gang, JobKind, JobSpec, Placement

from .placement import Usage, WorkerView, fit
from .transitions import Statement, job_to, task_end

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


def busy_ports(active_tasks: Sequence[sqlite3.Row]) -> set[tuple[str, int]]:
    """``(address, port)`` of the rendezvous of every active gang."""
    out = set()
    for t in active_tasks:
        if t["gang"]:
            g = json.loads(t["gang"])
            out.add((g["master_addr"], g["master_port"]))
    return out


def pick_port(address: str, busy: set[tuple[str, int]]) -> int:
    """A rendezvous port on ``address`` that no active gang uses."""
    lo, hi = PORT_RANGE
    for _ in range(100):
        port = random.randint(lo, hi)  # spreading ports, not a secret
        if (address, port) not in busy:
            return port
    raise RuntimeError(f"no free rendezvous port on {address} in {lo}-{hi}")


def place(
    now: float,
    job: sqlite3.Row,
    spec: JobSpec,
    nodes: list[Node],
    address: str,
    port: int,
    new_id: Callable[[], str],
) -> list[Statement]:
    """Statements that give ``job`` one scheduled task per node (lock held)."""
    attempt = job["attempts"] + 1
    stmts: list[Statement] = []
    for rank, node in enumerate(nodes):
        gang = Gang(
            node_rank=rank,
            nnodes=spec.nodes,
            nproc_per_node=spec.nproc_per_node,
            master_addr=address,
            master_port=port,
        )
        stmts.append(
            (
                "INSERT INTO tasks (id, job_id, attempt, state, worker_id, gpu_indices,"
                " created_at, node_rank, gang) VALUES (?, ?, ?, 'scheduled', ?, ?, ?, ?, ?)",
                (
                    new_id(),
                    job["id"],
                    attempt,
                    node.worker.id,
                    json.dumps(node.gpus),
                    now,
                    rank,
                    gang.model_dump_json(),
                ),
            )
        )
    head = nodes[0].worker.id
    stmts.append(
        ("UPDATE jobs SET attempts = ?, worker_id = ? WHERE id = ?", (attempt, head, job["id"]))
    )
    where = ", ".join(
        f"{n.worker.name}" + (f" (GPUs {','.join(map(str, n.gpus))})" if n.gpus else "")
        for n in nodes
    )
    why = f"gang of {spec.nodes} placed on {where}; rendezvous {address}:{port}"
    return [*stmts, *job_to(now, job, "scheduled", why)]


def gang_of(task: sqlite3.Row) -> Gang | None:
    """The rendezvous stored with a task (None for a task of another kind)."""
    return Gang.model_validate_json(task["gang"]) if task["gang"] else None


@dataclass
class GangEnd:
    """What ending one task of a gang does: statements, and running peers to stop."""

    statements: list[Statement]
    stop: list[tuple[str, str]]  # (worker_id, task_id)


def finish(
    now: float,
    job: sqlite3.Row,
    spec: JobSpec,
    tasks: Sequence[sqlite3.Row],
    task: sqlite3.Row,
    state: str,
    exit_code: int | None,
    reason: str,
    *,
    retry: bool,
    names: dict[str, str],
) -> GangEnd:
    """End ``task``; end its job and stop its peers as the gang's rules say (lock held).

    ``tasks`` are every task of the job (rows as stored now).
    """
    stmts = task_end(now, task, state, exit_code, reason)
    current = task["attempt"] == job["attempts"] and job["state"] in ("scheduled", "running")
    if not current:  # the gang already ended (or moved on to another attempt)
        return GangEnd(stmts, [])
    peers = [t for t in tasks if t["attempt"] == task["attempt"] and t["id"] != task["id"]]
    if state == "succeeded":
        if all(t["state"] == "succeeded" for t in peers):
            stmts += job_to(now, job, "succeeded", "every node exited 0", ended=True, exit_code=0)
        return GangEnd(stmts, [])
    node = f"node {task['node_rank']} on {names.get(task['worker_id'], task['worker_id'])}"
    why = f"{node}: {reason}"
    stop = []
    for peer in peers:
        if peer["state"] in ("scheduled", "running"):
            stmts += task_end(now, peer, "cancelled", None, f"gang stopped: {why}")
            if peer["state"] == "running":
                stop.append((peer["worker_id"], peer["id"]))
    if retry and state in ("failed", "lost") and job["attempts"] <= spec.retries:
        left = spec.retries - job["attempts"] + 1
        stmts += job_to(
            now,
            job,
            "queued",
            f"attempt {job['attempts']} {state} ({why}); retrying,"
            f" {left} attempt{'s' if left != 1 else ''} left",
        )
    else:
        stmts += job_to(now, job, state, why, ended=True, exit_code=exit_code)
    return GangEnd(stmts, stop)


def cancel(now: float, job: sqlite3.Row, tasks: Sequence[sqlite3.Row], reason: str) -> GangEnd:
    """Cancel a whole gang at once: every active node ends ``cancelled`` (lock held)."""
    stmts: list[Statement] = []
    stop = []
    for t in tasks:
        if t["state"] in ("scheduled", "running"):
            stmts += task_end(now, t, "cancelled", None, reason)
            if t["state"] == "running":
                stop.append((t["worker_id"], t["id"]))
    stmts += job_to(now, job, "cancelled", reason, ended=True)
    return GangEnd(stmts, stop)


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
