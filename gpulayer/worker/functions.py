"""Warm function runners: pre-started Python processes that make pickled calls.

A ``function`` task does not start an interpreter: it borrows a runner
(:mod:`gpulayer.worker.runner`) from the :class:`RunnerPool`, sends it the
payload and gets the outcomes back over a pipe, so a trivial call costs a
fraction of a millisecond on the worker.

Runners are kept per *key*: the job's owner (a function may change anything in
its runner's interpreter, so a runner never serves another owner), the GPU
reservation (``CUDA_VISIBLE_DEVICES`` is read once by CUDA, so a runner never
changes GPUs) and the job's ``env``. A runner is

* reused for the next call with the same key (the one with the most calls
  first: it has the user's imports and caches loaded),
* replaced when it crashes (only the call it was making fails, with the exit
  code or signal in the reason),
* killed, with its whole process group, on timeout or cancel,
* retired after ``max_calls`` calls, after ``idle_seconds`` unused, or when the
  pool needs room for a runner of another key.

``prestart`` runners for the plain key (no owner yet, no GPUs, no env) start with
the agent; the first owner that needs one claims it (a runner that never made a
call holds nothing of anyone's). A runner taken from the pool is replaced in the
background, so the next call finds one waiting.

The worker never unpickles what a runner sends: the runner is user code (and,
with a task user, another, unprivileged user), so its frames are JSON with the
call's outcomes as opaque bytes, which only the job's client unpickles.
"""

import asyncio
import contextlib
import itertools
import json
import logging
import os
import pickle
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulayer import contracts as c
from gpulayer.payload import Summary
from gpulayer.worker.environments import EnvHold, EnvRef, interpreter
from gpulayer.worker.runs import LineCallback, RunOutcome
from gpulayer.worker.spawning import child_options, task_user
from gpulayer.worker.workspace import keep_fence_mark, user_env

log = logging.getLogger(__name__)

_LEN_BYTES = 8
_MAX_FRAME_BYTES = 1 << 30  # a runner that announces more is broken (or hostile)
_START_TIMEOUT_SECONDS = 60.0

#: ``on_part(index, outcome)``: one call's outcome (an ``outcomes`` payload) as it returned.
PartCallback = Callable[[int, bytes], None]

#: ``(owner, gpu indices, job env, Python env)``; owner None: a fresh runner nobody has
#: claimed; Python env None: the worker's own interpreter.
Key = tuple[str | None, tuple[int, ...], tuple[tuple[str, str], ...], EnvRef | None]


class RunnerDied(Exception):
    """The runner process ended while it was making a call (or broke its protocol,
    ``broke`` saying how: it was killed then)."""

    def __init__(self, returncode: int | None, broke: str | None = None) -> None:
        self.returncode = returncode
        if broke is not None:
            super().__init__(f"the function's runner process {broke}; it was killed and replaced")
            return
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


def key_for(assignment: c.Assignment, python_env: EnvRef | None = None) -> Key:
    """The pool key of a task: its job's owner, GPU reservation, env (its secrets
    included: a runner started with a secret serves only calls given the same value) and
    Python env."""
    env = tuple(sorted({**assignment.spec.env, **assignment.secret_env()}.items()))
    return assignment.owner, tuple(assignment.gpu_indices), env, python_env


class Runner:
    """One runner process and its pipes."""

    _ids = itertools.count(1)

    def __init__(
        self,
        key: Key,
        proc: asyncio.subprocess.Process,
        name: str,
        folder: Path | None = None,
        hold: EnvHold | None = None,
    ) -> None:
        self.key = key
        self.hold = hold  # keeps its Python env from being evicted while it lives
        self.proc = proc
        self.name = name
        self.folder = folder  # its HOME and TMPDIR with a task user, removed with it
        self.calls = 0
        self.idle_since = time.monotonic()
        self.on_line: LineCallback | None = None  # the current call's, for C-level output
        #: Output outside a call goes to the worker's log at debug, not info (a
        #: prestarted runner whose failure the worker explains itself).
        self.quiet = False
        self._stderr_task = asyncio.create_task(self._pump_stderr(), name=f"{self.name}-stderr")

    @classmethod
    async def start(
        cls,
        key: Key,
        env: Mapping[str, str],
        homes: Path | None = None,
        hold: EnvHold | None = None,
        *,
        quiet: bool = False,
    ) -> "Runner":
        """Start a runner and wait for its ``ready`` frame; with a task user its HOME
        and TMPDIR are a folder of its own under ``homes``; ``hold`` (on its Python
        env) is released when it closes; ``quiet``: see :attr:`quiet`."""
        name = f"runner-{next(cls._ids)}"
        env = dict(env)
        folder = None
        if homes is not None and task_user() is not None:
            folder = await asyncio.to_thread(_runner_folder, homes / name)
            env = user_env(env, folder / "home", folder / "tmp")
        try:
            proc = await cls._spawn(env)
        except BaseException:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            if hold is not None:
                hold.release()
            raise
        runner = cls(key, proc, name, folder, hold)
        runner.quiet = quiet
        try:
            msg = await asyncio.wait_for(runner._recv(), _START_TIMEOUT_SECONDS)
        except BaseException:  # incl. cancellation by RunnerPool.close: reap it first
            await asyncio.shield(runner.close())
            raise
        if msg is None or msg[0] != "ready":
            await runner.close()
            raise RunnerDied(proc.returncode)
        log.debug("%s started (pid %d) for GPUs %s", runner.name, proc.pid, key[1] or "none")
        return runner

    @staticmethod
    async def _spawn(env: Mapping[str, str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            interpreter(env),
            "-m",
            "gpulayer.worker.runner",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            **child_options(),  # its own process group: a kill takes its children too
            limit=1024 * 1024,
        )

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def call(
        self,
        call_id: str,
        data: bytes,
        env: Mapping[str, str],
        cwd: Path,
        on_line: LineCallback,
        *,
        skip: Sequence[int] = (),
        on_part: PartCallback | None = None,
    ) -> tuple[bytes, Summary]:
        """Make the payload's calls (but those in ``skip``); lines they print go to
        ``on_line`` as they come, and, with ``on_part``, each call's outcome as it
        returns (a result part, docs/adr/0096).

        Raises
        ------
        RunnerDied
            If the process ended before answering.
        """
        assert self.proc.stdin is not None
        self.on_line = on_line
        self.calls += 1
        try:
            request = ("call", call_id, data, dict(env), str(cwd), list(skip), on_part is not None)
            frame = pickle.dumps(request, protocol=5)
            # One write: a length first on its own wakes the runner for 8 bytes, and
            # it sleeps again until the rest comes (two wake-ups per call).
            self.proc.stdin.write(len(frame).to_bytes(_LEN_BYTES, "big") + frame)
            try:
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise RunnerDied(await self._exit_code()) from None
            while True:
                msg = await self._recv()
                if msg is None:
                    raise RunnerDied(await self._exit_code())
                if msg[0] == "out":
                    on_line(msg[1], msg[2], datetime.now(UTC))
                elif msg[0] == "part" and msg[1] == call_id and on_part is not None:
                    on_part(msg[2], msg[3])
                elif msg[0] == "done" and msg[1] == call_id:
                    return msg[2], msg[3]
        finally:
            self.on_line = None
            self.idle_since = time.monotonic()

    async def _recv(self) -> tuple[Any, ...] | None:
        """The next frame (``ready``, ``out``, ``part`` or ``done`` with its outcomes), checked;
        None at end of file.

        Raises
        ------
        RunnerDied
            If the runner sent something that is not such a frame (it is killed).
        """
        head = await self._frame()
        if head is None:
            return None
        try:
            msg = json.loads(head)
            kind = msg[0]
            if kind == "ready" and len(msg) == 2 and isinstance(msg[1], int):
                return ("ready", msg[1])
            if kind == "out" and len(msg) == 3 and isinstance(msg[2], str):
                return ("out", c.LogStream(msg[1]), msg[2])
            if kind == "part" and len(msg) == 3 and isinstance(msg[1], str):
                index = msg[2]
                part = await self._frame()
                if type(index) is int and index >= 0 and part is not None:
                    return ("part", msg[1], index, part)
            if kind == "done" and len(msg) == 5:
                _, call_id, calls, errors, first_error = msg
                summary = Summary(int(calls), int(errors), str(first_error))
                outcomes = await self._frame()
                if isinstance(call_id, str) and outcomes is not None:
                    return ("done", call_id, outcomes, summary)
        except (ValueError, TypeError, IndexError, KeyError):
            pass
        self.kill()
        raise RunnerDied(None, "sent a frame that is not the runner protocol")

    async def _frame(self) -> bytes | None:
        """One length-prefixed frame, or None at end of file."""
        assert self.proc.stdout is not None
        try:
            head = await self.proc.stdout.readexactly(_LEN_BYTES)
            size = int.from_bytes(head, "big")
            if size > _MAX_FRAME_BYTES:
                self.kill()
                raise RunnerDied(None, f"announced a frame of {size} bytes")
            return await self.proc.stdout.readexactly(size)
        except asyncio.IncompleteReadError:
            return None

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
                log.log(logging.DEBUG if self.quiet else logging.INFO, "%s: %s", self.name, text)

    def kill(self) -> None:
        """SIGKILL the runner's process group (the runner and what it started)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Kill and reap (and remove its folder)."""
        self.kill()
        with contextlib.suppress(ProcessLookupError):
            await self.proc.wait()
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._stderr_task
        if self.folder is not None:
            await asyncio.to_thread(shutil.rmtree, self.folder, True)
            self.folder = None
        if self.hold is not None:
            self.hold.release()
            self.hold = None


def _runner_folder(root: Path) -> Path:
    """``root`` with ``home/`` and ``tmp/``, all the task user's (blocking)."""
    user = task_user()
    assert user is not None
    for d in (root, root / "home", root / "tmp"):
        d.mkdir(mode=0o700)
        os.chown(d, user.uid, user.gid)
    return root


@dataclass
class RunnerPool:
    """Idle runners by key; see the module docstring.

    Parameters
    ----------
    base_env
        The environment every runner starts from (the worker's, minus its secrets).
    homes
        Where runners started as a task user get their HOME and TMPDIR (a folder
        each, outside the worker's data dir).
    max_idle
        Most runners kept over all keys, busy ones included (the worker's slots).
    max_calls, idle_seconds
        When a runner is retired.
    prestart
        Runners kept ready for the plain key.
    hold
        Takes a hold on a Python env (so it is not evicted while a runner uses it).
    """

    base_env: Mapping[str, str]
    homes: Path | None = None
    max_idle: int = 4
    max_calls: int = 1000
    idle_seconds: float = 600.0
    prestart: int = 1
    hold: Callable[[str], EnvHold | None] | None = None
    _idle: dict[Key, list[Runner]] = field(default_factory=dict)
    _starting: dict[Key, int] = field(default_factory=dict)
    _busy: set[Runner] = field(default_factory=set)
    _closed: bool = False
    _spares: set[asyncio.Task[None]] = field(default_factory=set)
    _prestart_error: BaseException | None = None  # the first quiet prestart's failure

    PLAIN: Key = (None, (), (), None)

    def start(self, *, quiet: bool = False) -> None:
        """Start the prestarted runners in the background; ``quiet``: a failure is
        kept for :meth:`prestarted` (and logged at debug), not logged as an error."""
        for _ in range(self.prestart):
            self._spare(self.PLAIN, quiet=quiet)

    async def prestarted(self) -> BaseException | None:
        """Once the prestarted runners are up (or failed): None when one is up, else
        why the first failed (:class:`RunnerDied`, or the ``OSError`` of its exec).
        A worker whose tasks run as another user takes a runner that came up, as that
        user, as the proof that the user can run this Python and gpulayer."""
        name = _spare_name(self.PLAIN)
        starting = [t for t in self._spares if t.get_name() == name]
        if starting:
            await asyncio.wait(starting)
        for runner in self._idle.get(self.PLAIN, ()):
            runner.quiet = False
        return None if self.idle_count(self.PLAIN) else self._prestart_error

    def env_for(self, key: Key) -> dict[str, str]:
        """A runner's environment: the base, the job's env, the GPU reservation, its
        Python env."""
        _, gpus, job_env, python_env = key
        env = dict(self.base_env)
        env.update(job_env)
        if python_env is not None:
            env = python_env.apply(env)
        keep_fence_mark(env, self.base_env)
        visible = ",".join(map(str, gpus))
        env.update(CUDA_VISIBLE_DEVICES=visible, HIP_VISIBLE_DEVICES=visible)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def take(self, key: Key) -> Runner:
        """An idle runner for ``key`` (its owner's), else a fresh unclaimed one, else a
        new one; a spare starts behind it."""
        self._retire_stale()
        unclaimed: Key = (None, key[1], key[2], key[3])
        while True:
            # The warmest runner first: it has the user's imports and caches loaded.
            idle = self._idle.get(key) or self._idle.get(unclaimed)
            if idle:
                runner = max(idle, key=lambda r: (r.calls, r.idle_since))
                idle.remove(runner)
                if runner.alive:
                    runner.key = key  # claimed: from now on it serves this owner only
                    break
                await runner.close()
                continue
            names = {_spare_name(key), _spare_name(unclaimed)}
            starting = [t for t in self._spares if t.get_name() in names]
            if starting:  # one is on its way: cheaper than starting a second
                await asyncio.wait(starting, return_when=asyncio.FIRST_COMPLETED)
                continue
            runner = await self._start(key)
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

    def _spare(self, key: Key, *, quiet: bool = False) -> None:
        if self._closed:
            return
        self._starting[key] = self._starting.get(key, 0) + 1

        async def start() -> None:
            try:
                runner = await self._start(key, quiet=quiet)
            except Exception as e:  # a background start: the next take() starts one itself
                if not quiet:
                    log.exception("could not start a spare runner")
                    return
                log.debug("could not start a prestarted runner: %s", e)
                self._prestart_error = self._prestart_error or e
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

    async def _start(self, key: Key, *, quiet: bool = False) -> Runner:
        hold = None
        if key[3] is not None and self.hold is not None:
            hold = await asyncio.to_thread(self.hold, key[3].key)
            if hold is None:
                raise RunnerDied(None, f"could not start: its Python env {key[3].key} is gone")
        return await Runner.start(key, self.env_for(key), self.homes, hold, quiet=quiet)

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
        on_part: PartCallback | None = None,
        python_env: EnvRef | None = None,
        env_python: str = "",
    ) -> None:
        self._pool = pool
        self._on_part = on_part  # each call's outcome as it returns (calls > 1)
        self._python_env = python_env
        self._env_python = env_python  # major.minor of the Python env's interpreter
        self._a = assignment
        self._data = data
        self._env = dict(env)  # the per-call variables (task_vars)
        self._cwd = cwd
        self._on_line = on_line
        self._cancelled = False
        self._cancel_reason: str | None = None
        self._runner: Runner | None = None
        self._call: asyncio.Task[tuple[bytes, Summary]] | None = None

    @property
    def pid(self) -> int | None:
        """The runner process making the call (for per-task telemetry)."""
        return None if self._runner is None else self._runner.proc.pid

    def cancel(self, reason: str) -> None:
        """Stop the call (its runner is killed); the run ends ``cancelled``."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    def interrupt(self) -> None:
        """Nothing to do: a call is only ever stopped whole (:meth:`cancel`)."""

    async def run(self) -> RunOutcome:
        """Make the call; never raises for what the function does."""
        spec = self._a.spec
        if self._cancelled:
            return RunOutcome("cancelled", None, self._cancel_reason)
        pickled_by = spec.function.python if spec.function is not None else ""
        if self._env_python and pickled_by and pickled_by != self._env_python:
            why = (
                f"Python version mismatch: the function was pickled by Python {pickled_by},"
                f" its environment runs Python {self._env_python}"
            )
            self._on_line(c.LogStream.system, why, datetime.now(UTC))
            return RunOutcome("failed", None, why, retry=False)
        runner = self._runner = await self._pool.take(key_for(self._a, self._python_env))
        making = runner.call(
            self._a.task_id, self._data, self._env, self._cwd, self._on_line,
            skip=self._a.done_calls, on_part=self._on_part,
        )  # fmt: skip
        # A task of its own, which cancel() cancels; no task waits for the cancel
        # beside it (two tasks and their wake-ups on the path of every call).
        call = self._call = asyncio.create_task(making)
        if self._cancelled:  # while it waited for a runner
            call.cancel()
        try:
            result, summary = await asyncio.wait_for(call, spec.timeout)
        except (TimeoutError, asyncio.CancelledError):
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # the run itself is being cancelled (the worker is stopping)
            with contextlib.suppress(asyncio.CancelledError, RunnerDied):
                await call  # done already, unless the timeout's cancel is still going
            await self._pool.discard(runner)
            if self._cancelled:
                return RunOutcome("cancelled", None, self._cancel_reason)
            assert spec.timeout is not None
            return RunOutcome("timed_out", None, f"timed out after {spec.timeout:g} s")
        except RunnerDied as e:
            await self._pool.discard(runner)
            self._on_line(c.LogStream.system, str(e), datetime.now(UTC))
            return RunOutcome("failed", e.returncode, str(e))
        finally:
            self._runner = self._call = None
        await self._pool.give_back(runner)
        if summary.errors == 0:
            return RunOutcome("succeeded", 0, None, result=result)
        if summary.calls == 1:
            why = f"raised {summary.first_error}"
        else:
            why = f"{summary.errors} of {summary.calls} calls raised; first: {summary.first_error}"
        retry = spec.function is not None and spec.function.retry_exceptions
        return RunOutcome("failed", 1, why, result=result, retry=retry)
