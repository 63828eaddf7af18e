"""Pick and prepare the :class:`~gpulayer.worker.runs.Run` of an assignment.

=======================  =================================  ==========================
the assignment           its run                            prepared here
=======================  =================================  ==========================
command, shell           :class:`CommandRun`                folder, bundle, metrics
command with a gang      :class:`GangRun`                   folder, bundle, metrics
function                 :class:`FunctionRun` (warm runner)  folder, bundle, payload
function with a gang     :class:`GangCallRun`               folder, bundle, payload,
                                                            metrics
session                  :class:`SessionRun`                folder
relay session (kernel)   :class:`RelayedKernelRun`          folder, bundle (the
                                                            notebook's folder)
cell                     :class:`CellTaskRun`               folder (none for a plain
                                                            cell of a session), push
=======================  =================================  ==========================

Preparing may download a bundle, a payload or a push from the control plane;
when one is missing or corrupt the run never starts and the task fails. A job
with an ``environment`` gets its Python env from the worker's
:class:`~gpulayer.worker.environments.EnvCache` (built unless cached; its phase
reported to the control plane), applied to the run: commands and ranks find its
``bin`` first on ``PATH``, runners and kernels start its interpreter.
"""

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer import contracts as c
from gpulayer.errors import GpulayerError
from gpulayer.worker.environments import EnvBuildFailed, EnvCache, Prepared
from gpulayer.worker.functions import FunctionRun, RunnerPool
from gpulayer.worker.gang_call import GangCallRun
from gpulayer.worker.kernel_runs import CellTaskRun, SessionRun
from gpulayer.worker.kernels import KernelHost, session_key
from gpulayer.worker.network import Network
from gpulayer.worker.process import CommandRun
from gpulayer.worker.record import TaskRecord
from gpulayer.worker.runs import Run
from gpulayer.worker.torchrun import GangRun
from gpulayer.worker.workspace import ControlPlaneAddress, TaskDir, task_env, task_vars

if TYPE_CHECKING:  # at run time imported by the first relay session: it loads ZMQ (ADR 0141)
    from gpulayer.worker.relayed_kernels import RelayOpener

log = logging.getLogger(__name__)

#: ``blob(sha256)``: a bundle or payload by its hash (raises a GpulayerError).
BlobSource = Callable[[str], Awaitable[bytes]]
#: ``blob_file(sha256)``: a bundle by its hash, as a file in the worker's cache.
BlobFile = Callable[[str], Awaitable[Path]]
#: ``report(task_id, environment)``: tell the control plane how a task's env is doing.
EnvReport = Callable[[str, c.TaskEnvironment], Awaitable[None]]

#: Empty call folders kept for an owner's next calls (one per call running at once),
#: and for all owners together (a worker many owners use keeps no folder per owner).
_SPARES_PER_OWNER = 4
_SPARES = 16


def _plain_call(a: c.Assignment) -> bool:
    """A function call in a warm runner without a bundle: its folder is only its
    empty cwd and artifacts (no home/, tmp/ or unpacked files)."""
    return a.spec.function is not None and a.gang is None and a.spec.bundle is None


class Launcher:
    """Makes each task's run, over what the worker keeps between tasks: its function
    runners, its session kernels and its tasks' folders."""

    def __init__(
        self,
        *,
        worker_name: str,
        tasks_root: Path,
        runners: RunnerPool,
        kernels: KernelHost,
        blob: BlobSource,
        kill_grace_seconds: float,
        blob_file: BlobFile | None = None,
        control_plane: ControlPlaneAddress | None = None,
        network: Callable[[], Network] | None = None,
        envs: EnvCache | None = None,
        report_env: EnvReport | None = None,
        open_relay: "RelayOpener | None" = None,
    ) -> None:
        self._open_relay = open_relay
        self._envs = envs
        self._report_env = report_env
        self._name = worker_name
        self._network = network
        self._control_plane = control_plane
        self._tasks_root = tasks_root
        self._runners = runners
        self._kernels = kernels
        self._blob = blob
        self._blob_file = blob_file
        self._kill_grace_seconds = kill_grace_seconds
        # Per owner: folders of ended calls that wrote no file, for its next calls.
        self._spares: dict[str, list[TaskDir]] = {}
        self._kept = 0  # folders in _spares

    def park(self, task: TaskRecord) -> bool:
        """Keep the folder of an ended call in a warm runner for its owner's next
        call, when the call left it empty (blocking: three ``scandir``); False when it
        is to be removed as usual (ADR 0145)."""
        a, folder = task.assignment, task.dir
        if folder is None or not _plain_call(a):
            return False
        spares = self._spares.get(a.owner, [])
        if len(spares) >= _SPARES_PER_OWNER or self._kept >= _SPARES or not folder.left_empty():
            return False
        self._spares.setdefault(a.owner, spares).append(folder)
        self._kept += 1
        return True

    def _spare(self, owner: str) -> TaskDir | None:
        """An empty folder ``owner``'s earlier call left, taken (None: there is none)."""
        spares = self._spares.get(owner)
        if not spares:
            return None
        folder = spares.pop()
        if not spares:
            del self._spares[owner]
        self._kept -= 1
        return folder

    def expect(self, assignment: c.Assignment) -> None:
        """Note an assignment as it arrives: cells placed in a session that is
        assigned here wait for its kernel."""
        if assignment.spec.session is not None:
            self._kernels.expect(session_key(assignment, assignment.spec.session.name))

    async def prepare(self, task: TaskRecord) -> Run:
        """The task's run, ready to start; its folder is kept in ``task.dir``.

        Raises
        ------
        GpulayerError
            If a bundle, payload or push cannot be had, or a bundle is unsafe.
        """
        a = task.assignment
        if a.spec.kind in (c.JobKind.cell, c.JobKind.session):
            return await self._kernel_run(task)
        fn = a.spec.function
        log.log(
            logging.DEBUG if fn else logging.INFO,
            "task %s (job %s, attempt %d) started",
            a.task_id,
            a.job_id,
            a.attempt,
        )
        if fn is None or a.gang is not None:  # a call stays quiet: its log is its prints
            where = _gpus(a.gpu_indices)
            started = f"started on {self._name} ({where})"
            task.logs.add(c.LogStream.system, started, _now(), hold=True)
        # Without a bundle the folder is handed over as it is made: one hand-off. A call
        # in a warm runner uses its runner's HOME and TMPDIR: no home/ or tmp/ here.
        folder = await task.make_dir(
            self._tasks_root,
            hand_over=a.spec.bundle is None,
            own_home=fn is None or a.gang is not None,
            spare=self._spare(a.owner) if _plain_call(a) else None,
        )
        if a.spec.bundle is not None:
            bundle: bytes | Path = (
                await self._blob_file(a.spec.bundle)
                if self._blob_file is not None
                else await self._blob(a.spec.bundle)
            )
            await asyncio.to_thread(folder.unpack, bundle)  # a file: read a block at a time
            await task.file_work(folder.hand_over)  # after the unpack: see TaskDir.hand_over
        python_env = await self._python_env(task)
        if fn is None:
            return self._command_run(task, folder, python_env)
        payload = fn.payload if fn.payload is not None else await self._blob(fn.payload_blob or "")
        if a.gang is not None:
            return self._gang_call_run(task, folder, payload, python_env)
        # The runner has the rest of the environment already.
        env = task_vars(a, folder.artifacts, self._control_plane)
        on_part = task.parts.add if task.parts is not None else None
        return FunctionRun(
            self._runners,
            a,
            payload,
            env=env,
            cwd=folder.work,
            on_line=task.logs.add,
            on_part=on_part,
            python_env=python_env.ref if python_env else None,
            env_python=python_env.report.python if python_env else "",
        )

    async def _python_env(self, task: TaskRecord) -> Prepared | None:
        """The job's Python env, built or taken from the cache and held for the task
        (None when the job names none).

        Raises
        ------
        EnvBuildFailed
            With the installer's message (the task fails, not retried).
        """
        spec = task.assignment.spec.environment
        if spec is None or spec.empty:
            return None
        if self._envs is None:
            raise EnvBuildFailed("this worker keeps no environments")

        def line(text: str) -> None:
            task.logs.add(c.LogStream.system, text, _now())

        async def report(env: c.TaskEnvironment) -> None:
            if env.cached and task.assignment.spec.function is not None:
                task.env_on_completion = env  # a warm call: no extra round trip
            elif self._report_env is not None:
                task.report_env(self._report_env, env)

        prepared = await self._envs.prepare(spec, line, report, fetch=self._blob)
        task.env_hold = prepared.hold
        return prepared

    def _command_run(self, task: TaskRecord, folder: TaskDir, python_env: Prepared | None) -> Run:
        """A command, alone or as one node of a gang; its training metrics followed."""
        a = task.assignment
        env = folder.user_env(task_env(a, folder.artifacts, control_plane=self._control_plane))
        env = _activate(env, python_env)
        task.follow_metrics(env)
        grace = self._kill_grace_seconds
        if a.gang is not None:
            env.update(self._socket_env(a))
            return GangRun(
                a, cwd=folder.work, env=env, on_line=task.logs.add, kill_grace_seconds=grace
            )
        return CommandRun(
            a.spec, cwd=folder.work, env=env, on_line=task.logs.add, kill_grace_seconds=grace
        )

    def _gang_call_run(
        self, task: TaskRecord, folder: TaskDir, payload: bytes, python_env: Prepared | None
    ) -> Run:
        """One node of a distributed function; its training metrics followed."""
        a = task.assignment
        env = folder.user_env(task_env(a, folder.artifacts, control_plane=self._control_plane))
        env.update(self._socket_env(a))
        env = _activate(env, python_env)
        task.follow_metrics(env)
        return GangCallRun(
            a,
            payload,
            root=folder.root,
            cwd=folder.work,
            env=env,
            on_line=task.logs.add,
            kill_grace_seconds=self._kill_grace_seconds,
        )

    def _socket_env(self, a: c.Assignment) -> dict[str, str]:
        """The interface a rank's collective backend uses (unless the job names one)."""
        return self._network().socket_env(a.spec.env) if self._network else {}

    async def _kernel_run(self, task: TaskRecord) -> Run:
        """A cell or session, in a headless kernel (:mod:`gpulayer.worker.kernels`)."""
        a = task.assignment
        log.debug("task %s (job %s, %s) started", a.task_id, a.job_id, a.spec.kind)
        cell = a.spec.cell
        if cell is not None and cell.session and not (cell.push or cell.push_blob or cell.pull):
            # A plain cell in a session touches no files: skip its folder (latency).
            return CellTaskRun(
                self._kernels, a, env={}, cwd=Path(), scratch=Path(), on_line=task.logs.add
            )
        folder = await task.make_dir(self._tasks_root)
        if a.spec.bundle is not None:  # a kernel's notebook folder (--sync-workdir)
            bundle: bytes | Path = (
                await self._blob_file(a.spec.bundle)
                if self._blob_file is not None
                else await self._blob(a.spec.bundle)
            )
            await asyncio.to_thread(folder.unpack, bundle)
        env = folder.user_env(task_env(a, folder.artifacts, control_plane=self._control_plane))
        relay = a.spec.session is not None and a.spec.session.relay
        site = folder.root / "site-packages"
        if relay:
            site.mkdir(exist_ok=True)  # before the hand-over: the task user's
        await task.file_work(folder.hand_over)
        env = _activate(env, await self._python_env(task))
        if relay:
            env = _own_packages(env, site)
            if self._open_relay is None:
                raise GpulayerError("this worker cannot relay kernels (no control plane address)")
            from gpulayer.worker.relayed_kernels import RelayedKernelRun

            return RelayedKernelRun(self._kernels, a, env=env, cwd=folder.work,
                                    on_line=task.logs.add, open_relay=self._open_relay)  # fmt: skip
        if a.spec.session is not None:
            return SessionRun(self._kernels, a, env=env, cwd=folder.work, on_line=task.logs.add)
        assert cell is not None
        push = cell.push if cell.push_blob is None else await self._blob(cell.push_blob)
        return CellTaskRun(
            self._kernels,
            a,
            env=env,
            cwd=folder.work,
            scratch=folder.root,
            on_line=task.logs.add,
            push=push,
        )


def _own_packages(env: dict[str, str], site: Path) -> dict[str, str]:
    """A kernel's own package folder: ``%pip install`` (and any pip the kernel runs)
    installs there (``PIP_TARGET``), on its ``PYTHONPATH``, so it imports at once
    and neither the worker's Python nor a cached env is changed (docs/kernels.md)."""
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return {**env, "PIP_TARGET": str(site), "PYTHONPATH": path}


def _activate(env: dict[str, str], python_env: Prepared | None) -> dict[str, str]:
    return env if python_env is None else python_env.ref.apply(env)


def _gpus(indices: list[int]) -> str:
    """``GPU 0``, ``GPUs 0, 1`` or ``no GPU``."""
    listed = ", ".join(str(i) for i in indices)
    if not listed:
        return "no GPU"
    return f"GPU {listed}" if len(indices) == 1 else f"GPUs {listed}"


def _now() -> datetime:
    return datetime.now(UTC)
