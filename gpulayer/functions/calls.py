"""One remote call: the :class:`Call` handle, and :func:`wait` / :func:`as_completed`
over many (like :mod:`concurrent.futures`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Literal, TypeVar

from gpulayer import contracts, errors, payload
from gpulayer.client.connection import Connection
from gpulayer.client.jobs import Job
from gpulayer.client.logs import stored_lines
from gpulayer.client.pending import say_on_stderr, wait_explained, wait_to_start
from gpulayer.functions.tracebacks import outcomes, value

R = TypeVar("R")


class Call(Generic[R]):
    """One remote call: what :meth:`RemoteFunction.spawn` answers.

    Works with :func:`wait` and :func:`as_completed`.
    """

    def __init__(
        self,
        conn: Connection,
        info: contracts.Job,
        name: str = "",
        fn: Callable[..., Any] | None = None,
    ) -> None:
        self.connection = conn
        self.info = info
        self.name = name or info.name
        self._fn = fn  # to show the local source lines of a remote traceback

    def __repr__(self) -> str:
        return f"<Call {self.name} job={self.id} {self.info.state}>"

    @property
    def id(self) -> str:
        """The call's job id."""
        return self.info.id

    @property
    def job(self) -> Job:
        """The call's :class:`~gpulayer.Job` (artifacts, events, placement)."""
        return Job(self.connection, self.info)

    def done(self) -> bool:
        """Whether the call has ended (asks the control plane while it has not)."""
        if not self.info.state.terminal:
            self.info = self.connection.job(self.id)
        return self.info.state.terminal

    def result(self, timeout: float | None = None) -> R:
        """Wait for the call (at most ``timeout`` s) and answer its value.

        Raises
        ------
        Exception
            The remote exception, as its own type, with the remote traceback.
        RemoteError
            When the remote exception's class does not exist here.
        JobFailed
            When the call timed out, was cancelled, or its worker or runner was lost.
        TimeoutError
            If it did not end within ``timeout``.

        While the call is queued, why it waits is said on stderr, as :meth:`follow` does.
        """
        self.info = wait_explained(self.connection, self.info, timeout)
        got: list[payload.Outcome | None] = [*outcomes(self.connection, self.info)] or [None]
        (outcome,) = got
        answer: R = value(outcome, self.info, self._fn)
        return answer

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's exception, or None when it returned a value."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as e:  # what the remote function raised is the answer here
            return e
        return None

    def cancel(self) -> bool:
        """Cancel the call (its runner is stopped); False when it had already ended."""
        try:
            self.info = self.connection.cancel(self.id)
        except errors.InvalidTransition:
            return False
        return True

    def logs(self) -> list[str]:
        """What the call printed so far."""
        return self.job.logs()

    def echo(self) -> None:
        """Print the lines stored so far (stdout and stderr where they belong)."""
        echo(self.connection, self.id)

    def follow(self) -> None:
        """Print lines live until the call ends; while it waits for a worker, say why
        (on stderr, as ``[gpulayer] job ID queued: ...``)."""
        self.info = wait_to_start(self.connection, self.info, say_on_stderr)
        _print_lines(self.connection.follow_logs(self.id))
        self.info = self.connection.job(self.id, retry=True)


def echo(conn: Connection, job_id: str) -> None:
    """Print the lines job ``job_id`` stored so far (stdout and stderr where they belong)."""
    _print_lines(stored_lines(conn, job_id))


def _print_lines(lines: Iterable[contracts.LogLine]) -> None:
    for line in lines:
        stream = sys.stderr if line.stream == contracts.LogStream.stderr else sys.stdout
        if line.stream == contracts.LogStream.system:
            stream = sys.stderr
        text = line.text if line.rank is None else f"[{line.rank}] {line.text}"
        print(text, file=stream, flush=True)


def wait(
    calls: Iterable[Call[Any]],
    timeout: float | None = None,
    return_when: Literal["ALL_COMPLETED", "FIRST_COMPLETED"] = "ALL_COMPLETED",
) -> tuple[list[Call[Any]], list[Call[Any]]]:
    """Wait for calls like :func:`concurrent.futures.wait`: answers ``(done, not_done)``."""
    calls = list(calls)
    deadline = None if timeout is None else time.monotonic() + timeout
    for _ in _ended(calls, deadline):
        if return_when == "FIRST_COMPLETED":
            break
    done = [c for c in calls if c.info.state.terminal]
    return done, [c for c in calls if not c.info.state.terminal]


def as_completed(calls: Iterable[Call[Any]], timeout: float | None = None) -> Iterator[Call[Any]]:
    """Yield calls as they end, like :func:`concurrent.futures.as_completed`.

    Raises
    ------
    TimeoutError
        If some have not ended within ``timeout``.
    """
    calls = list(calls)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = 0
    for call in _ended(calls, deadline):
        seen += 1
        yield call
    if seen < len(calls):
        raise TimeoutError(f"{len(calls) - seen} of {len(calls)} calls did not end in time")


def _ended(calls: list[Call[Any]], deadline: float | None) -> Iterator[Call[Any]]:
    """Calls as they end (each once), until all did or the deadline passed."""
    pending: dict[Connection, dict[str, Call[Any]]] = {}
    for call in calls:
        if call.info.state.terminal:
            yield call
        else:
            pending.setdefault(call.connection, {})[call.id] = call
    while any(pending.values()):
        for conn, by_id in pending.items():
            if not by_id:
                continue
            hold = 30.0 if deadline is None else deadline - time.monotonic()
            if hold <= 0:
                return
            hold = min(hold, 30.0) if len(pending) == 1 else min(hold, 0.5)
            for info in conn.wait_any(list(by_id), timeout=hold):
                call = by_id.pop(info.id)
                call.info = info
                yield call
