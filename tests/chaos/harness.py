"""The chaos suite's harness: jobs that print numbered lines and append to a ledger,
and the three invariants every fault is checked against (docs/faults.md).

(a) **No acknowledged job is lost**: every job id a client was given ends, in a
    state that makes sense (``succeeded``, after a retry where one was needed, or
    an explicit failure whose reason names the fault), never gone, never stuck.
(b) **Once**: no two attempts of one job overlap (an attempt's last beat is
    before the next attempt's start), and a job's side effect (its id appended to
    the ledger when it finishes) happens exactly once.
(c) **Every acknowledged log line once**: each attempt's stored numbered lines
    are ``0..k`` in order without duplicates; the finished attempt has all of
    them; every line the control plane had acknowledged before the fault is still
    there; an attempt that was lost with its worker says so in a system line
    (with how many lines were lost when the worker had reported them), never
    silently.

Jobs run as the task user (``gpulayer-task`` under a root worker), so their files
go in :func:`gl_shared_dir <tests.conftest.gl_shared_dir>`'s folder, here
:class:`Ledger`.
"""

from __future__ import annotations

import collections
import itertools
import re
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpulayer import contracts
from gpulayer.client.connection import Connection
from gpulayer.client.logs import stored_lines

from ..support import until

PY = sys.executable
#: How long a job may take to end after its fault (a lease, a restart, a retry).
END_SECONDS = 120.0

#: One job: per task (attempt) it notes when it started (``start``), that it is alive
#: (``beat``, every 0.05 s while it waits, after every line) and how many lines it
#: is about to have printed (``printing``, written *before* each line, so it never
#: counts fewer than were printed); it prints ``line 0`` .. ``line n-1`` (``pause``
#: seconds apart), waiting before line ``hold`` until ``<folder>/<gate>`` exists, and
#: appends its job id to
#: ``<folder>/ledger`` when it finishes (the side effect that must happen once).
NUMBERED = r"""
import os, sys, time
folder, n, hold, pause, gate = sys.argv[1:]
n, hold, pause = int(n), int(hold), float(pause)
job, task = os.environ["GPULAYER_JOB_ID"], os.environ["GPULAYER_TASK_ID"]
me = os.path.join(folder, task)
def note(name, text):  # whole or not at all: the test may read it any time
    with open(me + ".tmp", "w") as f:
        f.write(text)
    os.replace(me + ".tmp", me + "." + name)
note("start", repr(time.time()))
for i in range(n):
    if i == hold:
        while not os.path.exists(os.path.join(folder, gate)):
            note("beat", repr(time.time()))
            time.sleep(0.05)
    note("printing", str(i + 1))
    print("line %d" % i, flush=True)
    note("beat", repr(time.time()))
    time.sleep(pause)
with open(os.path.join(folder, "ledger"), "a") as f:
    f.write(job + "\n")
note("beat", repr(time.time()))
"""

_NUMBERED_LINE = re.compile(r"^line (\d+)$")
_CALL_LINE = re.compile(r"^call (\d+) line (\d+)$")
#: What the control plane writes when a lost attempt's lines were cut off.
GAP = re.compile(r"^── (?:(\d+) lines? of attempt (\d+) lost|attempt (\d+) lost)")


@dataclass
class Ledger:
    """The folder jobs write to (the task user can), with the gate and the ledger."""

    folder: Path

    @property
    def gate(self) -> Path:
        return self.folder / "gate"

    def open_gate(self, name: str = "gate") -> None:
        (self.folder / name).touch()

    def entries(self) -> list[str]:
        path = self.folder / "ledger"
        return path.read_text().split() if path.exists() else []

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(self.entries())

    def note(self, task_id: str, name: str) -> str | None:
        """What a task of a :data:`NUMBERED` job noted (``start``, ``beat``, ``printing``)."""
        path = self.folder / f"{task_id}.{name}"
        return path.read_text() if path.exists() else None

    def numbered(self, n: int, hold: int = -1, pause: float = 0.0, gate: str = "gate") -> list[str]:
        """The command of a :data:`NUMBERED` job writing here (``hold`` -1: no gate;
        ``pause``: seconds between lines; ``gate``: the gate file's name)."""
        argv = [str(self.folder), str(n), str(hold), str(pause), gate]
        return [PY, "-c", NUMBERED, *argv]


# ------------------------------------------------------------- the invariants


def ended(conn: Connection, job_ids: Iterable[str]) -> dict[str, contracts.Job]:
    """(a), first half: every job ends within :data:`END_SECONDS` (each exists:
    ``conn.job`` raises NotFound for one that was silently lost)."""
    jobs: dict[str, contracts.Job] = {}
    for job_id in job_ids:
        jobs[job_id] = conn.wait(job_id, timeout=END_SECONDS)
    return jobs


def ends_sensibly(
    jobs: dict[str, contracts.Job], failure: Callable[[contracts.Job], bool] | None = None
) -> None:
    """(a), second half: each job succeeded, or (where ``failure`` admits it) failed
    with a reason that names the fault."""
    for job in jobs.values():
        if job.state == contracts.JobState.succeeded:
            continue
        assert failure is not None and failure(job), (
            f"job {job.id} ended {job.state}: {job.reason!r} (tasks: {attempts(job)})"
        )


def attempts(job: contracts.Job) -> list[tuple[int, str, str | None, str | None]]:
    return [(t.attempt, t.state.value, t.worker_name, t.reason) for t in job.tasks]


def once(ledger: Ledger, jobs: dict[str, contracts.Job]) -> None:
    """(b): attempts of a job never overlap, and each job that succeeded appended its
    id exactly once (one that failed, at most once)."""
    counts = ledger.counts()
    for job in jobs.values():
        want = 1 if job.state == contracts.JobState.succeeded else counts[job.id]
        assert counts[job.id] == want and want <= 1, (
            f"job {job.id} ({job.state}) did its side effect {counts[job.id]} times"
        )
        tasks = sorted(job.tasks, key=lambda t: t.created_at)
        ran = [t for t in tasks if ledger.note(t.id, "start")]
        for task in ran:
            last = ledger.note(task.id, "beat")
            if task.state == contracts.JobState.lost and last and task.ended_at:
                assert float(last) < task.ended_at.timestamp(), (
                    f"job {job.id}: attempt {task.attempt} still ran"
                    f" {float(last) - task.ended_at.timestamp():.2f}s after it was given up"
                    f" ({attempts(job)})"
                )
        for before, after in itertools.pairwise(ran):
            last, start = ledger.note(before.id, "beat"), ledger.note(after.id, "start")
            assert last is not None and start is not None
            assert float(last) < float(start), (
                f"job {job.id}: attempt {before.attempt} beat {float(last) - float(start):.2f}s"
                f" into attempt {after.attempt}"
            )


@dataclass
class Snapshot:
    """The lines the control plane had acknowledged (stored) at one moment, by job."""

    lines: dict[str, list[tuple[int, str | None, str]]] = field(default_factory=dict)


def acknowledged(conn: Connection, job_ids: Iterable[str]) -> Snapshot:
    """Every stored line of these jobs now: what must survive the fault."""
    snap = Snapshot()
    for job_id in job_ids:
        snap.lines[job_id] = [(ln.offset, ln.task_id, ln.text) for ln in stored_lines(conn, job_id)]
    return snap


def logs_once(
    conn: Connection,
    ledger: Ledger,
    jobs: dict[str, contracts.Job],
    n: int,
    before: Snapshot | None = None,
    lines: dict[str, int] | None = None,
) -> None:
    """(c) for :data:`NUMBERED` jobs of ``n`` lines (``lines``: of another count, by id)."""
    for job in jobs.values():
        n_job = (lines or {}).get(job.id, n)
        stored = list(stored_lines(conn, job.id))
        if before is not None:
            kept = {(ln.offset, ln.task_id, ln.text) for ln in stored}
            missing = [x for x in before.lines.get(job.id, []) if x not in kept]
            assert not missing, f"job {job.id}: acknowledged lines gone after the fault: {missing}"
        for task in job.tasks:
            mine = [ln for ln in stored if ln.task_id == task.id]
            got = [int(m[1]) for ln in mine if (m := _NUMBERED_LINE.match(ln.text))]
            assert got == list(range(len(got))), (
                f"job {job.id} attempt {task.attempt}: lines out of order or twice: {got}"
            )
            if task.state == contracts.JobState.succeeded:
                assert got == list(range(n_job)), f"job {job.id}: finished with lines {got}"
            elif task.state == contracts.JobState.lost:
                printed = int(ledger.note(task.id, "printing") or 0)
                _said_so(job.id, task, mine, delivered=len(got), printed=printed)


def _said_so(
    job_id: str, task: contracts.Task, mine: list[contracts.LogLine], delivered: int, printed: int
) -> None:
    """A lost attempt that printed more than was delivered says so in a system line;
    a count of lost lines never claims more than the attempt printed."""
    system = [ln.text for ln in mine if ln.stream == contracts.LogStream.system]
    gaps = [m for text in system if (m := GAP.match(text))]
    assert gaps or printed <= delivered, (
        f"job {job_id} attempt {task.attempt} was lost ({task.reason}) after delivering"
        f" {delivered} of {printed} printed lines, and its log does not say so: {system}"
    )
    for m in gaps:
        if m[1] is not None:
            assert delivered + int(m[1]) <= printed, (
                f"job {job_id}: a gap of {m[1]} lines after {delivered}, but {printed} printed"
            )


# ---------------------------------------------------------------- processes


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Waiter(threading.Thread):
    """Runs ``fn`` in a thread (once started) and keeps its answer or its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as e:  # handed to the test
            self.error = e

    def answer(self) -> Any:
        self.join(END_SECONDS)
        assert not self.is_alive(), "still waiting long after the fault"
        if self.error is not None:
            raise self.error
        return self.value


def lines_stored(conn: Connection, job_id: str, at_least: int) -> bool:
    """Whether the control plane acknowledged ``at_least`` numbered lines of the job."""
    texts = [ln.text for ln in stored_lines(conn, job_id)]
    return sum(1 for t in texts if _NUMBERED_LINE.match(t)) >= at_least


def wait_lines(conn: Connection, job_id: str, at_least: int, what: str = "") -> None:
    until(
        lambda: lines_stored(conn, job_id, at_least),
        timeout=60,
        what=what or f"{at_least} lines of job {job_id} to be stored",
    )


# ------------------------------------------------------------------------ maps


def numbered_call(i: int, folder: str, lines: int, held: bool) -> int:
    """One call of a chaos map: prints ``call i line 0`` .. ``line lines-1``; a
    ``held`` call then waits for the gate; appends ``item-i`` to the ledger when it
    finishes (its side effect) and answers ``i * i``."""
    import os
    import time

    for j in range(lines):
        print(f"call {i} line {j}", flush=True)
    while held and not os.path.exists(os.path.join(folder, "gate")):
        time.sleep(0.05)
    with open(os.path.join(folder, "ledger"), "a") as f:
        f.write(f"item-{i}\n")
    return i * i


def finished_items(ledger: Ledger) -> set[int]:
    return {int(e.removeprefix("item-")) for e in ledger.entries() if e.startswith("item-")}


def map_once(ledger: Ledger, results: list[Any], failed_ok: Callable[[Any], bool]) -> None:
    """(a) and (b) for a map over :func:`numbered_call`: one result per item, its value
    or (where ``failed_ok`` admits it) an explicit failure; each item with a value did
    its side effect exactly once, one that failed at most once."""
    counts = ledger.counts()
    for i, got in enumerate(results):
        if isinstance(got, BaseException):
            assert failed_ok(got), f"item {i}: {got!r}"
            assert counts[f"item-{i}"] <= 1, f"item {i} failed but ran {counts[f'item-{i}']} times"
        else:
            assert got == i * i, f"item {i}: {got!r}"
            assert counts[f"item-{i}"] == 1, f"item {i} ran {counts[f'item-{i}']} times"


def map_logs_once(
    conn: Connection, job_ids: Iterable[str], lines: int, before: Snapshot | None = None
) -> None:
    """(c) for a map over :func:`numbered_call`: in each attempt every call's lines are
    ``0..k`` in order without duplicates; a call that finished printed all of them;
    lines acknowledged before the fault are still there."""
    for job_id in job_ids:
        stored = list(stored_lines(conn, job_id))
        if before is not None:
            kept = {(ln.offset, ln.task_id, ln.text) for ln in stored}
            missing = [x for x in before.lines.get(job_id, []) if x not in kept]
            assert not missing, f"job {job_id}: acknowledged lines gone after the fault: {missing}"
        by_call: dict[tuple[str | None, int], list[int]] = collections.defaultdict(list)
        for ln in stored:
            if m := _CALL_LINE.match(ln.text):
                by_call[(ln.task_id, int(m[1]))].append(int(m[2]))
        for (task_id, i), got in by_call.items():
            assert got == list(range(len(got))), (
                f"job {job_id} task {task_id}: call {i}'s lines out of order or twice: {got}"
            )
            assert len(got) <= lines
