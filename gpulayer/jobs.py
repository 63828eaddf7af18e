"""The :class:`Job` handle: what ``gl.submit`` returns and users hold on to."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self, overload

from gpulayer import contracts, errors

if TYPE_CHECKING:
    from gpulayer.client import Connection


class Job:
    """A handle on a submitted job.

    ``state`` is the last state seen; ``status`` asks the control plane again.

    Examples
    --------
    >>> job = gl.submit("nvidia-smi", gpus=1)
    >>> job.wait().state
    'succeeded'
    >>> print("\\n".join(job.logs()))
    """

    def __init__(self, conn: Connection, info: contracts.Job) -> None:
        self.connection = conn
        self.info = info

    @property
    def id(self) -> str:
        """The job id."""
        return self.info.id

    @property
    def name(self) -> str:
        """The job's name, or its id when it has none."""
        return self.info.name

    @property
    def state(self) -> contracts.JobState:
        """The state last seen (no request; see :attr:`status`)."""
        return self.info.state

    @property
    def status(self) -> str:
        """The current state, fetched from the control plane."""
        return str(self.refresh().state)

    @property
    def exit_code(self) -> int | None:
        """The exit code of the last attempt, once it ended."""
        return self.info.exit_code

    @property
    def artifacts(self) -> list[contracts.Artifact]:
        """The files the job kept."""
        return self.connection.artifacts(self.id)

    def refresh(self) -> Self:
        """Fetch the job again; returns self."""
        self.info = self.connection.job(self.id)
        return self

    def wait(self, timeout: float | None = None, raise_on_failure: bool = False) -> Self:
        """Block until the job ends; returns self.

        Parameters
        ----------
        timeout
            Seconds to wait at most (None: no limit).
        raise_on_failure
            Raise :class:`~gpulayer.errors.JobFailed` unless the job succeeded.

        Raises
        ------
        TimeoutError
            If the job has not ended within ``timeout``.
        JobFailed
            With ``raise_on_failure``, when it failed, timed out, was lost or cancelled.
        """
        self.info = self.connection.wait(self.id, timeout)
        if raise_on_failure and self.info.state != contracts.JobState.succeeded:
            raise self.failure()
        return self

    def failure(self) -> errors.JobFailed:
        """The :class:`~gpulayer.errors.JobFailed` describing how the job ended."""
        return failure_of(self.info)

    @overload
    def logs(self, follow: Literal[False] = False) -> list[str]: ...
    @overload
    def logs(self, follow: Literal[True]) -> Iterator[contracts.LogLine]: ...
    def logs(self, follow: bool = False) -> list[str] | Iterator[contracts.LogLine]:
        """The job's output.

        Returns
        -------
        list of str or iterator of LogLine
            Without ``follow``, the text of every line stored so far. With
            ``follow``, an iterator of :class:`~gpulayer.contracts.LogLine` that
            yields lines as they arrive and ends when the job has ended.
        """
        if follow:
            return self.connection.follow_logs(self.id)
        lines: list[str] = []
        offset = 0
        while True:
            page = self.connection.logs(self.id, offset)
            lines.extend(line.text for line in page.lines if line.offset >= offset)
            if not page.lines or page.next_offset <= offset:
                return lines
            offset = page.next_offset

    def metrics(self, after: int = 0) -> list[contracts.StoredMetricPoint]:
        """The training metric points stored so far (``{"train/loss": ...}`` per
        log point of a :class:`gpulayer.pytorch.Trainer` run), oldest first, from
        after point ``after`` on (its ``seq``)."""
        points: list[contracts.StoredMetricPoint] = []
        while True:
            page = self.connection.metrics(self.id, after)
            points.extend(page.points)
            if not page.points:
                return points
            after = page.next_after

    def cancel(self) -> Self:
        """Ask the control plane to cancel the job; returns self."""
        self.info = self.connection.cancel(self.id)
        return self

    def download(
        self, dest: str | os.PathLike[str] = ".", names: Sequence[str] | None = None
    ) -> list[Path]:
        """Download the job's artifacts (or only ``names``) below ``dest``."""
        return self.connection.download(self.id, dest, names)

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict:
        """A live :class:`~gpulayer.widgets.JobMonitor` in a notebook, a summary elsewhere."""
        from gpulayer import widgets

        return widgets.job_bundle(self, include, exclude)

    def __repr__(self) -> str:
        short = self.id if len(self.id) <= 8 else self.id[:6] + "…"
        parts = [f"<Job {short}", str(self.info.state)]
        if self.info.exit_code is not None:
            parts.append(f"exit={self.info.exit_code}")
        if self.info.worker_name:
            parts.append(f"worker={self.info.worker_name}")
        return " ".join(parts) + ">"


def failure_of(info: contracts.Job) -> errors.JobFailed:
    """The :class:`~gpulayer.errors.JobFailed` describing how a job ended."""
    code = "" if info.exit_code is None else f" (exit {info.exit_code})"
    reason = f": {info.reason}" if info.reason else ""
    return errors.JobFailed(
        f"job {info.id} {info.state}{code}{reason}",
        job_id=info.id,
        state=str(info.state),
        reason=info.reason,
        exit_code=info.exit_code,
        worker=info.worker_name,
    )
