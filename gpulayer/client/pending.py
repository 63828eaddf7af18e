"""Why a job waits, said where people wait for it.

``gpulayer submit`` (and ``--follow``), ``gpulayer logs -f``, ``Job.wait``,
``%%gpulayer`` cells and the ``JobMonitor`` widget all explain a queued job the
same way, from the control plane's own answer (``Job.pending_reasons``, and
``Job.unsatisfiable`` when no registered worker could ever run it):

* a job no worker could ever run is said at once, with what to do about it;
* any other job still queued after :data:`NOTE_AFTER_SECONDS` is said then;
* and again whenever the reason changes (:class:`PendingNotes`).

Followers poll the job every :data:`POLL_SECONDS` while it is queued
(:func:`wait_to_start`), so the first note comes within about two seconds.
"""

import sys
import time
from collections.abc import Callable
from typing import Protocol

from gpulayer import contracts

#: A queued job is explained once it has waited this long (at once when unsatisfiable).
NOTE_AFTER_SECONDS = 2.0
#: How often a follower asks again while its job is queued.
POLL_SECONDS = 1.0

#: What to do about a job that needs GPUs no registered worker has.
GPU_HINT = (
    "join a worker that has them (`gpulayer join URL` on that machine), or try it on"
    " simulated GPUs: `gpulayer up --simulated-gpus 1xA100-80GB`"
)
#: What to do about a job no registered worker could ever run for another reason.
WORKER_HINT = "join a worker that has what it needs (`gpulayer join URL` on that machine)"


class JobReader(Protocol):
    """What :func:`wait_to_start` needs of a connection."""

    def job(self, job_id: str) -> contracts.Job:
        """The job as it is now."""
        ...


def hint(info: contracts.Job) -> str:
    """What to do about an unsatisfiable job ('' for any other)."""
    if not info.unsatisfiable:
        return ""
    return GPU_HINT if info.spec.resources.gpus else WORKER_HINT


def why_queued(info: contracts.Job) -> str | None:
    """Why ``info`` waits, in one line (None unless it is queued)::

    cannot start: unsatisfiable: no registered worker could ever run this job
    (local-1: needs 1 × GPU, has no GPUs); join a worker that has them ...

    queued: local-1: all 4 task slots busy; behind 2 queued jobs
    """
    if info.state != contracts.JobState.queued:
        return None
    reasons = "; ".join(info.pending_reasons)
    if info.unsatisfiable:
        summary = info.reason or "no registered worker could ever run it"
        if reasons and reasons != summary:
            summary += f" ({reasons})"
        return f"cannot start: {summary}; {hint(info)}"
    return f"queued: {reasons or info.reason or 'waiting for placement'}"


class PendingNotes:
    """Decides when to say why a job waits: see the module docstring.

    Feed it every state of the job seen; :meth:`note` answers the line to show, or
    None when there is nothing new to say.
    """

    def __init__(
        self,
        after: float = NOTE_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._due = clock() + after
        self._last: str | None = None

    def note(self, info: contracts.Job) -> str | None:
        """The line to show about ``info`` now (``job ID cannot start: ...``), or None."""
        why = why_queued(info)
        if why is None:
            self._last = None  # a job queued again (a retry) is explained anew
            return None
        if why == self._last or (not info.unsatisfiable and self._clock() < self._due):
            return None
        self._last = why
        return f"job {info.id} {why}"


class JobWaiter(JobReader, Protocol):
    """What :func:`wait_explained` needs of a connection."""

    def wait(self, job_id: str, timeout: float | None = None) -> contracts.Job:
        """The job once it ended (``TimeoutError`` after ``timeout`` s)."""
        ...


def wait_to_start(
    conn: JobReader,
    info: contracts.Job,
    say: Callable[[str], None],
    *,
    poll: float = POLL_SECONDS,
    deadline: float | None = None,
) -> contracts.Job:
    """Poll a job while it is queued, passing :class:`PendingNotes`' lines to ``say``;
    answers the job once it is no longer queued (placed, running, or ended), or
    still queued once ``time.monotonic()`` passes ``deadline``."""
    notes = PendingNotes()
    while True:
        line = notes.note(info)
        if line is not None:
            say(line)
        if info.state != contracts.JobState.queued:
            return info
        if deadline is not None and time.monotonic() >= deadline:
            return info
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))
        info = conn.job(info.id)


def say_on_stderr(text: str) -> None:
    """Where library waits (``Job.wait``, a call's ``result``) say why: stderr."""
    print(f"[gpulayer] {text}", file=sys.stderr, flush=True)


def wait_explained(
    conn: JobWaiter,
    info: contracts.Job,
    timeout: float | None = None,
    say: Callable[[str], None] = say_on_stderr,
) -> contracts.Job:
    """``conn.wait`` for the job ``info`` names, saying why while it is queued (as
    :func:`wait_to_start` does), within ``timeout`` s in all.

    Raises
    ------
    TimeoutError
        If it has not ended within ``timeout`` (the message says why, when queued).
    """
    if info.state.terminal:
        return info
    deadline = None if timeout is None else time.monotonic() + timeout
    if info.state == contracts.JobState.queued:  # the last state seen: ask again
        info = wait_to_start(conn, conn.job(info.id), say, deadline=deadline)
        if info.state.terminal:
            return info
    if info.state != contracts.JobState.queued:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return conn.wait(info.id, left)
        except TimeoutError:
            info = conn.job(info.id)  # said below with the caller's timeout, not what was left
    why = why_queued(info) or f"it is {info.state}"
    raise TimeoutError(f"job {info.id} did not end within {timeout:g}s ({why})")
