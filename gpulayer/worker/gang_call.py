"""One node of a distributed function (``@gl.remote(nodes=..., nproc_per_node=...)``).

Every rank of the gang makes the same call (:mod:`gpulayer.worker.rank_call`),
launched like any gang node by :class:`~gpulayer.worker.torchrun.GangRun`. Global
rank 0's outcome is the answer, sent back by node 0; when the function raised on
a rank of this node, that rank's exception is the answer instead, and the task
is retried only if the function asks for it.
"""

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from gpulayer import contracts as c
from gpulayer.worker import rank_call
from gpulayer.worker.environments import interpreter
from gpulayer.worker.runs import RunOutcome
from gpulayer.worker.torchrun import GangRun, RankedLineCallback
from gpulayer.worker.workspace import read_owned, write_for_task

_PAYLOAD_FILE = "call.payload"


class GangCallRun:
    """A :class:`GangRun` of ``python -m gpulayer.worker.rank_call`` whose outcome
    carries the call's answer.

    Parameters
    ----------
    assignment
        The function task (its ``gang`` set).
    payload
        The pickled call, written to ``root`` for the ranks to read.
    root
        The task's folder: the payload goes in, the ranks' outcomes come out.
    cwd, env, on_line, kill_grace_seconds
        As for :class:`GangRun`.
    """

    def __init__(
        self,
        assignment: c.Assignment,
        payload: bytes,
        *,
        root: Path,
        cwd: Path,
        env: Mapping[str, str],
        on_line: RankedLineCallback,
        kill_grace_seconds: float = 5.0,
    ) -> None:
        assert assignment.gang is not None and assignment.spec.function is not None
        self._payload = payload
        self._root = root
        self._node_rank = assignment.gang.node_rank
        self._retry_exceptions = assignment.spec.function.retry_exceptions
        argv = [interpreter(env), "-m", "gpulayer.worker.rank_call", str(root / _PAYLOAD_FILE)]
        spec = assignment.spec.model_copy(update={"command": argv, "shell": None, "function": None})
        self._gang = GangRun(
            assignment.model_copy(update={"spec": spec}),
            cwd=cwd,
            env={**env, "GPULAYER_CALL_DIR": str(root)},
            on_line=on_line,
            kill_grace_seconds=kill_grace_seconds,
        )

    @property
    def pid(self) -> int | None:
        """The node's first process."""
        return self._gang.pid

    def cancel(self, reason: str) -> None:
        """Stop every rank of the node."""
        self._gang.cancel(reason)

    def interrupt(self) -> None:
        """Nothing to do: a node is only ever stopped whole (:meth:`cancel`)."""

    async def run(self) -> RunOutcome:
        """Run the node; a succeeded node 0, or a rank that raised, brings the answer."""
        root = self._root
        await asyncio.to_thread(write_for_task, root / _PAYLOAD_FILE, self._payload)
        out = await self._gang.run()
        answer = None
        if out.state == "succeeded" and self._node_rank == 0:
            answer = root / rank_call.OUTCOME_FILE
        elif out.state == "failed" and any(root.glob(rank_call.RAISED_PREFIX + "*")):
            # The function raised (not a crash): no retry unless asked; the failing
            # rank's exception is the answer when it was one of this node's.
            out = dataclasses.replace(out, retry=self._retry_exceptions)
            if self._gang.failed_rank is not None:
                answer = rank_call.raised_file(root, self._gang.failed_rank)
        if answer is not None and answer.exists():
            # The ranks' file (a link the task planted is refused, like any stray file).
            try:
                result = await asyncio.to_thread(read_owned, answer)
            except OSError as e:
                return RunOutcome("failed", out.exit_code, f"the call's answer is unreadable: {e}")
            out = dataclasses.replace(out, result=result)
        return out
