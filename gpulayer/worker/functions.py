"""Warm function runners: pre-started Python processes that make pickled calls.

A ``function`` task does not start an interpreter: it borrows a runner
(:mod:`gpulayer.worker.runner`) from the :class:`RunnerPool`, sends it the
payload and gets the outcomes back over a pipe, so a trivial call costs a
fraction of a millisecond on the worker.

Runners are kept per *key*: the GPU reservation (``CUDA_VISIBLE_DEVICES`` is
read once by CUDA, so a runner never changes GPUs) and the job's ``env``. A
runner is

* reused for the next call with the same key (the one with the most calls
  first: it has the user's imports and caches loaded),
* replaced when it crashes (only the call it was making fails, with the exit
  code or signal in the reason),
* killed, with its whole process group, on timeout or cancel,
* retired after ``max_calls`` calls, after ``idle_seconds`` unused, or when the
  pool needs room for a runner of another key.

``prestart`` runners for the plain key (no GPUs, no env) start with the agent,
and a runner taken from the pool is replaced in the background, so the next call
finds one waiting.
"""

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulayer import contracts as c
from gpulayer.payload import Summary
from gpulayer.worker.runs import LineCallback, RunOutcome
from gpulayer.worker.spawning import child_options
from gpulayer.worker.workspace import keep_fence_mark

log = logging.getLogger(__name__)

_LEN_BYTES = 8
_START_TIMEOUT_SECONDS = 60.0

Key = tuple[tuple[int, ...], tuple[tuple[str, str], ...]]


class RunnerDied(Exception):
    """The runner process ended while it was making a call."""

    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode
        if returncode is None:
            how = "closed its pipe"
        elif returncode < 0:
            try:
                how = f"was killed by {signal.Signals(-returncode).name}"
            except ValueError:
                how = f"was killed by signal {-returncode}"
        else:
            how = f"exited with code {returncode}"
        super().__init__(
            f"the function's runner process {how} during the call (os._exit, a crash in"
            " native code, or running out of memory); the runner was replaced"
        )


def key_for(assignment: c.Assignment) -> Key:
    """The pool key of a task: its GPU reservation and its job's env."""
    return tuple(assignment.gpu_indices), tuple(sorted(assignment.spec.env.items()))


class Runner:
    """One runner process and its pipes."""

    _ids = itertools.count(1)

    def __init__(self, key: Key, proc: asyncio.subprocess.Process) -> None:
        self.key = key
        self.proc = proc
        self.name = f"runner-{next(self._ids)}"
        self.calls = 0
        self.idle_since = time.monotonic()
        self.on_line: LineCallback | None = None  # the current call's, for C-level output
        self._stderr_task = asyncio.create_task(self._pump_stderr(), name=f"{self.name}-stderr")

    @classmethod
    async def start(cls, key: Key, env: Mapping[str, str]) -> "Runner":
        """Start a runner and wait for its ``ready`` frame."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpulayer.worker.runner",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            **child_options(),  # its own process group: a kill takes its children too
            limit=1024 * 1024,
        )
        runner = cls(key, proc)
        try:
            msg = await asyncio.wait_for(runner._recv(), _START_TIMEOUT_SECONDS)
        except BaseException:  # incl. cancellation by RunnerPool.close: reap it first
            await asyncio.shield(runner.close())
            raise
        if msg is None or msg[0] != "ready":
            runner.kill()
            await proc.wait()
            raise RunnerDied(proc.returncode)
        log.debug("%s started (pid %d) for GPUs %s", runner.name, proc.pid, key[0] or "none")
        return runner

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def call(
        self, call_id: str, data: bytes, env: Mapping[str, str], cwd: Path, on_line: LineCallback
    ) -> tuple[bytes, Summary]:
        """Make one call; lines it prints go to ``on_line`` as they come.

        Raises
        ------
        RunnerDied
            If the process ended before answering.
        """
        assert self.proc.stdin is not None
        self.on_line = on_line
        self.calls += 1
        try:
            frame = pickle.dumps(("call", call_id, data, dict(env), str(cwd)), protocol=5)
            self.proc.stdin.write(len(frame).to_bytes(_LEN_BYTES, "big"))
            self.proc.stdin.write(frame)
            try:
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise RunnerDied(await self._exit_code()) from None
            while True:
                msg = await self._recv()
                if msg is None:
                    raise RunnerDied(await self._exit_code())
                if msg[0] == "out":
                    on_line(c.LogStream(msg[1]), msg[2], datetime.now(UTC))
                elif msg[0] == "done" and msg[1] == call_id:
                    return msg[2], msg[3]
        finally:
            self.on_line = None
            self.idle_since = time.monotonic()

    async def _recv(self) -> tuple[Any, ...] | None:
        assert self.proc.stdout is not None
        try:
            head = await self.proc.stdout.readexactly(_LEN_BYTES)
            body = await self.proc.stdout.readexactly(int.from_bytes(head, "big"))
        except asyncio.IncompleteReadError:
            return None
        msg: tuple[Any, ...] = pickle.loads(body)  # a frame of gpulayer.worker.runner
        return msg

    async def _exit_code(self) -> int | None:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self.proc.wait(), 2.0)
        return None

    async def _pump_stderr(self) -> None:
        """Native output (fd 1 and 2): to the current call's log, else the worker's."""
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if self.on_line is not None:
                self.on_line(c.LogStream.stderr, text, datetime.now(UTC))
            else:
                log.info("%s: %s", self.name, text)

    def kill(self) -> None:
        """SIGKILL the runner's process group (the runner and what it started)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Kill and reap."""
        self.kill()
        with contextlib.suppress(ProcessLookupError):
            await self.proc.wait()
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._stderr_task


@dataclass
class RunnerPool:
    """Idle runners by key; see the module docstring.

    Parameters
    ----------
    base_env
        The environment every runner starts from (the worker's, minus its secrets).
    max_idle
        Most runners kept over all keys, busy ones included (the worker's slots).
    max_calls, idle_seconds
        When a runner is retired.
    prestart
        Runners kept ready for the plain key.
    """

    base_env: Mapping[str, str]
    max_idle: int = 4
    max_calls: int = 1000
    idle_seconds: float = 600.0
    prestart: int = 1
    _idle: dict[Key, list[Runner]] = field(default_factory=dict)
    _starting: dict[Key, int] = field(default_factory=dict)
    _busy: set[Runner] = field(default_factory=set)
    _closed: bool = False
    _spares: set[asyncio.Task[None]] = field(default_factory=set)

    PLAIN: Key = ((), ())

    def start(self) -> None:
        """Start the prestarted runners in the background."""
        for _ in range(self.prestart):
            self._spare(self.PLAIN)

    def env_for(self, key: Key) -> dict[str, str]:
        """A runner's environment: the base, the job's env, the GPU reservation."""
        gpus, job_env = key
        env = dict(self.base_env)
        env.update(job_env)
        keep_fence_mark(env, self.base_env)
        visible = ",".join(map(str, gpus))
        env.update(CUDA_VISIBLE_DEVICES=visible, HIP_VISIBLE_DEVICES=visible)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def take(self, key: Key) -> Runner:
        """An idle runner for ``key``, or a new one; a spare starts behind it."""
        self._retire_stale()
        while True:
            if idle := self._idle.get(key):
                # The warmest runner first: it has the user's imports and caches loaded.
                runner = max(idle, key=lambda r: (r.calls, r.idle_since))
                idle.remove(runner)
                if runner.alive:
                    break
                await runner.close()
                continue
            starting = [t for t in self._spares if t.get_name() == _spare_name(key)]
            if starting:  # one is on its way: cheaper than starting a second
                await asyncio.wait(starting, return_when=asyncio.FIRST_COMPLETED)
                continue
            runner = await Runner.start(key, self.env_for(key))
            break
        self._busy.add(runner)
        if not self._idle.get(key) and not self._starting.get(key) and self._room():
            self._spare(key)  # the next concurrent call of this key finds one ready
        return runner

    async def give_back(self, runner: Runner) -> None:
        """Keep a runner that answered for the next call (or retire it)."""
        self._busy.discard(runner)
        if self._closed or not runner.alive or runner.calls >= self.max_calls:
            await runner.close()
            return
        self._idle.setdefault(runner.key, []).append(runner)
        await self.trim()

    async def discard(self, runner: Runner) -> None:
        """Kill a runner that crashed, timed out or was cancelled."""
        self._busy.discard(runner)
        await runner.close()

    async def close(self) -> None:
        """Kill every runner (busy ones too) and wait for them."""
        self._closed = True
        spares = list(self._spares)
        for t in spares:
            t.cancel()
        await asyncio.gather(*spares, return_exceptions=True)
        runners = [r for rs in self._idle.values() for r in rs] + list(self._busy)
        self._idle.clear()
        await asyncio.gather(*(r.close() for r in runners), return_exceptions=True)

    def idle_count(self, key: Key | None = None) -> int:
        """Idle runners (of one key)."""
        if key is not None:
            return len(self._idle.get(key, ()))
        return sum(len(rs) for rs in self._idle.values())

    def _spare(self, key: Key) -> None:
        if self._closed:
            return
        self._starting[key] = self._starting.get(key, 0) + 1

        async def start() -> None:
            try:
                runner = await Runner.start(key, self.env_for(key))
            except Exception:  # a background start: the next take() starts one itself
                log.exception("could not start a spare runner")
                return
            finally:
                self._starting[key] -= 1
            if self._closed:
                await runner.close()
                return
            self._idle.setdefault(key, []).append(runner)
            await self.trim()

        task = asyncio.create_task(start(), name=_spare_name(key))
        self._spares.add(task)
        task.add_done_callback(self._spares.discard)

    def _room(self) -> bool:
        """Whether another runner fits: at most ``max_idle`` in all, busy ones included."""
        starting = sum(self._starting.values())
        return len(self._busy) + self.idle_count() + starting < self.max_idle

    async def trim(self) -> None:
        """Close the longest-idle runners beyond ``max_idle`` runners in all."""
        idle = sorted((r for rs in self._idle.values() for r in rs), key=lambda r: r.idle_since)
        surplus = idle[: max(0, len(idle) + len(self._busy) - self.max_idle)]
        for runner in surplus:  # all out of the pool before the first await: another
            self._idle[runner.key].remove(runner)  # trim (a spare, a give_back) may run then
        await asyncio.gather(*(r.close() for r in surplus), return_exceptions=True)

    def _retire_stale(self) -> None:
        now = time.monotonic()
        for rs in self._idle.values():
            for runner in [r for r in rs if now - r.idle_since > self.idle_seconds]:
                rs.remove(runner)
                runner.kill()


def _spare_name(key: Key) -> str:
    return f"spare-runner-{key!r}"


class FunctionRun:
    """One run of a ``function`` task in a pooled runner; the function-task
    counterpart of :class:`gpulayer.worker.process.CommandRun`."""

    def __init__(
        self,
        pool: RunnerPool,
        assignment: c.Assignment,
        data: bytes,
        *,
        env: Mapping[str, str],
        cwd: Path,
        on_line: LineCallback,
    ) -> None:
        self._pool = pool
        self._a = assignment
        self._data = data
        self._env = dict(env)  # the per-call variables (task_vars)
        self._cwd = cwd
        self._on_line = on_line
        self._cancelled = asyncio.Event()
        self._cancel_reason: str | None = None
        self._runner: Runner | None = None

    @property
    def pid(self) -> int | None:
        """The runner process making the call (for per-task telemetry)."""
        return None if self._runner is None else self._runner.proc.pid

    def cancel(self, reason: str) -> None:
        """Stop the call (its runner is killed); the run ends ``cancelled``."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        self._cancelled.set()

    def interrupt(self) -> None:
        """Nothing to do: a call is only ever stopped whole (:meth:`cancel`)."""

    async def run(self) -> RunOutcome:
        """Make the call; never raises for what the function does."""
        spec = self._a.spec
        if self._cancelled.is_set():
            return RunOutcome("cancelled", None, self._cancel_reason)
        runner = self._runner = await self._pool.take(key_for(self._a))
        call = asyncio.create_task(
            runner.call(self._a.task_id, self._data, self._env, self._cwd, self._on_line)
        )
        stop = asyncio.create_task(self._cancelled.wait())
        try:
            done, _ = await asyncio.wait({call, stop}, timeout=spec.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            stop.cancel()
        self._runner = None
        if call not in done:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, RunnerDied):
                await call
            await self._pool.discard(runner)
            if self._cancelled.is_set():
                return RunOutcome("cancelled", None, self._cancel_reason)
            return RunOutcome("timed_out", None, f"timed out after {spec.timeout:g} s")
        try:
            result, summary = call.result()
        except RunnerDied as e:
            await self._pool.discard(runner)
            self._on_line(c.LogStream.system, str(e), datetime.now(UTC))
            return RunOutcome("failed", e.returncode, str(e))
        await self._pool.give_back(runner)
        if summary.errors == 0:
            return RunOutcome("succeeded", 0, None, result=result)
        if summary.calls == 1:
            why = f"raised {summary.first_error}"
        else:
            why = f"{summary.errors} of {summary.calls} calls raised; first: {summary.first_error}"
        retry = spec.function is not None and spec.function.retry_exceptions
        return RunOutcome("failed", 1, why, result=result, retry=retry)
