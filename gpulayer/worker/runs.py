"""The Run protocol: the one face every kind of task run shows the pipeline.

A task runs as one of

* :class:`~gpulayer.worker.process.CommandRun`: a command or shell line,
* :class:`~gpulayer.worker.functions.FunctionRun`: a pickled call in a warm runner,
* :class:`~gpulayer.worker.kernel_runs.CellTaskRun`: a cell in a headless kernel,
* :class:`~gpulayer.worker.kernel_runs.SessionRun`: a kernel kept for a session,
* :class:`~gpulayer.worker.torchrun.GangRun`: one node of a distributed command,
* :class:`~gpulayer.worker.gang_call.GangCallRun`: one node of a distributed function.

:mod:`gpulayer.worker.launch` picks and prepares the run for an assignment;
:mod:`gpulayer.worker.pipeline` drives it (cancel, interrupt, run to its
:class:`RunOutcome`) and delivers what it produced. This module imports none of
them, so each can import :class:`RunOutcome` from here.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from gpulayer.contracts import LogStream, TaskCompletion

#: ``on_line(stream, text, ts)``: one line of output, without its newline.
LineCallback = Callable[[LogStream, str, datetime], None]


class HoldingLineCallback(Protocol):
    """A :data:`LineCallback` that can also ``hold`` a line: let it wait the batch
    time rather than go at once, so that a task's last line rides its completion
    (:meth:`gpulayer.worker.logs.LogShipper.add`)."""

    def __call__(
        self, stream: LogStream, text: str, ts: datetime, /, *, hold: bool = False
    ) -> None: ...


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, in the terms of :class:`~gpulayer.contracts.TaskCompletion`."""

    state: Literal["succeeded", "failed", "cancelled", "timed_out", "lost"]
    exit_code: int | None = None
    reason: str | None = None
    result: bytes | None = None  # a function or cell task's pickled outcomes or values
    retry: bool = True  # False: the failure is the program's answer (a function raised)

    def completion(self, result_blob: str | None = None) -> TaskCompletion:
        """The completion body the worker sends for this outcome; the result goes
        inline unless it was uploaded as ``result_blob``."""
        reason = None if self.reason is None else self.reason[:4096]
        return TaskCompletion(
            state=self.state,
            exit_code=self.exit_code,
            reason=reason,
            result=None if result_blob else self.result,
            result_blob=result_blob,
            retry=self.retry,
        )


class Run(Protocol):
    """One run of a task. :meth:`run` is called once; :meth:`cancel` and
    :meth:`interrupt` may come at any time, before, during or after it."""

    @property
    def pid(self) -> int | None:
        """The process the run's telemetry follows, while there is one."""
        ...

    def cancel(self, reason: str) -> None:
        """Stop the run; it ends ``cancelled`` with ``reason`` (the first one given)."""
        ...

    def interrupt(self) -> None:
        """SIGINT what runs the user's code, where that means something (a cell)."""
        ...

    async def run(self) -> RunOutcome:
        """Start the run, wait for its end and say how it ended; never raises for
        what the user's code does."""
        ...


def wake(fut: "asyncio.Future[None] | None") -> None:
    """Resolve ``fut`` unless it is None or done already: the one future a run's
    wait is woken by (its work's end, a cancel, a timer), whichever comes first."""
    if fut is not None and not fut.done():
        fut.set_result(None)
