"""Gang launch: one node of a distributed job, with rank-tagged lines and fail-fast.

The control plane hands each node a :class:`~gpulayer.contracts.Gang`: its node
rank, the gang's size and a static rendezvous on node 0 (``master_addr:port``).
Two launchers run the node's ``nproc_per_node`` processes:

``torchrun`` (default)
    ``python -m torch.distributed.run --nnodes N --nproc-per-node P --node-rank R
    --master-addr A --master-port Q --max-restarts 0 --tee 3 --no-python CMD``.
    ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` makes torchrun prefix every line
    of a rank with ``[gl-rank<global rank>]:``, which is stripped here and kept as
    the line's ``rank``. torchrun stops the node's other ranks when one fails; its
    failure summary names the first failed rank and its exit code.
``direct``
    gpulayer starts the P processes itself with ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` (what ``init_process_group("env://")`` reads), skipping
    torchrun's agent and its interpreter start; the first rank that fails stops
    the others.

A failing node's reason names the rank and the last error line it printed. A
rank that only failed because a peer went away (a closed connection) waits a
moment before reporting, so the node where the failure started reports first
and its reason becomes the job's.

The worker imports no torch: torchrun runs as a process of the task's Python.
"""

import asyncio
import collections
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from gpulayer.contracts import Assignment, Gang, LogStream
from gpulayer.worker.environments import interpreter
from gpulayer.worker.process import CommandRun, argv_for
from gpulayer.worker.runs import RunOutcome

#: ``on_line(stream, text, ts, rank)``.
RankedLineCallback = Callable[[LogStream, str, datetime, int | None], None]

_PREFIX = re.compile(r"^\[gl-rank(\d+)\]:(.*)$", re.DOTALL)
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid: \d+\)\s*(.*)$")
_COLLATERAL = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|ECONNRESET|DistNetworkError|"
    r"Socket Timeout|recvBytes|Connection refused",
)
_ERROR_LINE = re.compile(r"^\w[\w.]*(Error|Exception|Interrupt)\b")
_COLLATERAL_DELAY_SECONDS = 1.0
_TAIL_LINES = 40


def gang_env(gang: Gang) -> dict[str, str]:
    """The variables every process of a node sees (torchrun adds the per-rank ones)."""
    return {
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
        "NODE_RANK": str(gang.node_rank),
        "NNODES": str(gang.nnodes),
        "GROUP_RANK": str(gang.node_rank),
        "WORLD_SIZE": str(gang.world_size),
        "LOCAL_WORLD_SIZE": str(gang.nproc_per_node),
    }


def threads_env(env: Mapping[str, str], gang: Gang) -> dict[str, str]:
    """``env`` with ``OMP_NUM_THREADS=1`` when a node runs several ranks and the job
    did not set it: what torchrun would set, so each rank does not start a thread
    per core, and so torchrun does not print its untagged ``Setting
    OMP_NUM_THREADS ...`` banner into every node's log. Both launchers get it."""
    if gang.nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
        return {**env, "OMP_NUM_THREADS": "1"}
    return dict(env)


def torchrun_argv(gang: Gang, command: list[str], python: str = sys.executable) -> list[str]:
    """The torchrun command line of one node."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={gang.nnodes}",
        f"--nproc-per-node={gang.nproc_per_node}",
        f"--node-rank={gang.node_rank}",
        f"--master-addr={gang.master_addr}",
        f"--master-port={gang.master_port}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--tee=3",
        "--no-python",
        *command,
    ]


class _Tails:
    """The last lines of each rank, to explain a failure."""

    def __init__(self) -> None:
        self.lines: dict[int, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=_TAIL_LINES)
        )

    def add(self, rank: int, text: str) -> None:
        self.lines[rank].append(text)

    def error(self, rank: int) -> str | None:
        """The last line of ``rank`` that looks like an exception."""
        for text in reversed(self.lines.get(rank, ())):
            if _ERROR_LINE.match(text.strip()):
                return text.strip()[:500]
        return None

    def collateral(self, rank: int) -> bool:
        """Whether ``rank`` failed because a peer went away."""
        return any(_COLLATERAL.search(t) for t in self.lines.get(rank, ()))


class GangRun:
    """One node of a gang; the same face as :class:`~gpulayer.worker.process.CommandRun`."""

    def __init__(
        self,
        assignment: Assignment,
        *,
        cwd: Path,
        env: Mapping[str, str],
        on_line: RankedLineCallback,
        kill_grace_seconds: float = 5.0,
    ) -> None:
        assert assignment.gang is not None
        self.gang = assignment.gang
        self.spec = assignment.spec
        self.cwd = cwd
        self.env = {**env, **gang_env(self.gang)}
        self.on_line = on_line
        self.kill_grace_seconds = kill_grace_seconds
        self._tails = _Tails()
        self._runs: list[CommandRun] = []
        self._cancel_reason: str | None = None
        self._summary_rank: int | None = None
        self._summary_exit: str | None = None
        self.failed_rank: int | None = None  #: the global rank whose failure ended the node

    @property
    def pid(self) -> int | None:
        """The first process of the node (torchrun, or local rank 0)."""
        return self._runs[0].pid if self._runs else None

    def cancel(self, reason: str = "cancelled by user") -> None:
        """Stop every process of the node."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        for run in self._runs:
            run.cancel(reason)

    def interrupt(self) -> None:
        """Nothing to do: a node is only ever stopped whole (:meth:`cancel`)."""

    async def run(self) -> RunOutcome:
        """Run the node to its end."""
        if self._cancel_reason is not None:
            return RunOutcome("cancelled", None, self._cancel_reason)
        if self.spec.launcher == "direct":
            return await self._direct()
        return await self._torchrun()

    # ---------------------------------------------------------------- torchrun

    async def _torchrun(self) -> RunOutcome:
        argv = torchrun_argv(self.gang, argv_for(self.spec), interpreter(self.env))
        env = {**threads_env(self.env, self.gang),
               "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[gl-rank${rank}]:"}  # fmt: skip
        spec = self.spec.model_copy(update={"command": argv, "shell": None})
        run = CommandRun(
            spec,
            cwd=self.cwd,
            env=env,
            on_line=self._torchrun_line,
            kill_grace_seconds=self.kill_grace_seconds,
        )
        self._runs.append(run)
        out = await run.run()
        if out.state != "failed":
            return out
        rank = self._summary_rank
        if rank is None:
            return out
        how = self._summary_exit or out.reason or "failed"
        return await self._failed(rank, how, out.exit_code)

    def _torchrun_line(self, stream: LogStream, text: str, ts: datetime) -> None:
        m = _PREFIX.match(text)
        if m:
            rank, text = int(m.group(1)), m.group(2)
            self._tails.add(rank, text)
            self.on_line(stream, text, ts, rank)
            return
        # The summary lists other failures first, then "Root Cause (first observed
        # failure)": the last rank and exit code it names are the root cause.
        if r := _SUMMARY_RANK.match(text):
            self._summary_rank = int(r.group(1))
        elif e := _SUMMARY_EXIT.match(text):
            code, signal_text = int(e.group(1)), e.group(2).strip()
            self._summary_exit = f"exit code {code}" + (f" {signal_text}" if signal_text else "")
        self.on_line(stream, text, ts, None)

    # ------------------------------------------------------------------ direct

    async def _direct(self) -> RunOutcome:
        g = self.gang
        argv = argv_for(self.spec)
        spec = self.spec.model_copy(update={"command": argv, "shell": None})
        for local in range(g.nproc_per_node):
            rank = g.node_rank * g.nproc_per_node + local
            env = {**threads_env(self.env, g), "RANK": str(rank), "LOCAL_RANK": str(local)}
            self._runs.append(
                CommandRun(
                    spec,
                    cwd=self.cwd,
                    env=env,
                    on_line=self._direct_line(rank),
                    kill_grace_seconds=self.kill_grace_seconds,
                )
            )
        if self._cancel_reason is not None:
            for r in self._runs:
                r.cancel(self._cancel_reason)
        first = g.node_rank * g.nproc_per_node
        pending = {asyncio.ensure_future(r.run()): first + i for i, r in enumerate(self._runs)}
        outcomes: dict[int, RunOutcome] = {}
        failed: tuple[int, RunOutcome] | None = None
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    rank = pending.pop(fut)
                    outcomes[rank] = out = fut.result()
                    if out.state != "succeeded" and failed is None:
                        failed = (rank, out)
                        for r in self._runs:  # fail fast: stop the node's other ranks
                            r.cancel(f"rank {rank} {out.state}")
        finally:
            for fut in pending:
                fut.cancel()
        if failed is None:
            return RunOutcome("succeeded", 0, None)
        rank, out = failed
        if out.state in ("cancelled", "timed_out"):
            return out
        return await self._failed(rank, out.reason or "failed", out.exit_code)

    def _direct_line(self, rank: int) -> Callable[[LogStream, str, datetime], None]:
        def on_line(stream: LogStream, text: str, ts: datetime) -> None:
            self._tails.add(rank, text)
            self.on_line(stream, text, ts, rank)

        return on_line

    # ---------------------------------------------------------------- failures

    async def _failed(self, rank: int, how: str, exit_code: int | None) -> RunOutcome:
        if self._cancel_reason is not None:
            return RunOutcome("cancelled", exit_code, self._cancel_reason)
        self.failed_rank = rank
        error = self._tails.error(rank)
        reason = f"rank {rank} failed: {how}" + (f": {error}" if error else "")
        if self._tails.collateral(rank):
            # Most likely a peer's failure: let the node where it began report first.
            await asyncio.sleep(_COLLATERAL_DELAY_SECONDS)
        return RunOutcome("failed", exit_code, reason)
