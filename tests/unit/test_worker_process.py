"""The worker's process runner and log shipper, with real child processes.

Each test is a sync function that drives its coroutine with ``asyncio.run``, so it
does not depend on which async plugin the suite loads.
"""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer import bundle
from gpulayer.contracts import (
    Assignment,
    CellSpec,
    JobKind,
    JobSpec,
    KernelMessage,
    LogAck,
    LogBatch,
    LogStream,
    SessionSpec,
)
from gpulayer.worker.kernel_runs import CellTaskRun, SessionRun
from gpulayer.worker.kernels import Kernel, KernelHost, session_key
from gpulayer.worker.logs import LogShipper
from gpulayer.worker.process import CommandRun
from gpulayer.worker.runs import RunOutcome
from gpulayer.worker.workspace import PRIVATE_ENV, ControlPlaneAddress, TaskDir, task_env

from ..support import until, until_async

GRACE_SECONDS = 0.5


class Lines:
    """An ``on_line`` callback that records what it is given."""

    def __init__(self) -> None:
        self.got: list[tuple[LogStream, str]] = []

    def __call__(self, stream: LogStream, text: str, ts: datetime) -> None:
        assert ts.tzinfo is not None
        self.got.append((stream, text))

    def of(self, stream: LogStream) -> list[str]:
        return [text for s, text in self.got if s == stream]


def command_run(tmp_path: Path, lines: Lines, **spec: object) -> CommandRun:
    return CommandRun(
        JobSpec(**spec),  # type: ignore[arg-type]
        cwd=tmp_path,
        env=os.environ,
        on_line=lines,
        kill_grace_seconds=GRACE_SECONDS,
    )


def run(tmp_path: Path, **spec: object) -> tuple[RunOutcome, Lines]:
    lines = Lines()
    outcome = asyncio.run(command_run(tmp_path, lines, **spec).run())
    return outcome, lines


def sleeps_in_tree(pid: int) -> list[psutil.Process]:
    try:
        leader = psutil.Process(pid)
        tree = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    return [p for p in tree if p.name() == "sleep"]


def gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def run_and_collect_sleeps(
    cr: CommandRun, action: Callable[[], None] | None = None
) -> tuple[RunOutcome, list[psutil.Process]]:
    """Run ``cr``, wait until its two ``sleep`` processes exist, then ``action``."""
    task = asyncio.create_task(cr.run())
    await until_async(lambda: cr.pid is not None and len(sleeps_in_tree(cr.pid)) == 2, 10)
    assert cr.pid is not None
    sleeps = sleeps_in_tree(cr.pid)
    if action is not None:
        action()
    return await task, sleeps


# ------------------------------------------------------------------ output


def test_stdout_and_stderr_lines_arrive_in_order_on_their_stream(tmp_path: Path) -> None:
    outcome, lines = run(
        tmp_path,
        shell="for i in 1 2 3; do echo out$i; echo err$i >&2; done; echo; printf 'tail'",
    )
    assert outcome == RunOutcome("succeeded", 0, None)
    assert lines.of(LogStream.stdout) == ["out1", "out2", "out3", "", "tail"]
    assert lines.of(LogStream.stderr) == ["err1", "err2", "err3"]


def test_a_200kb_line_without_newline_arrives_intact(tmp_path: Path) -> None:
    code = "import sys; sys.stdout.write('x' * 200_000 + 'END')"
    outcome, lines = run(tmp_path, command=[sys.executable, "-c", code])
    assert outcome.state == "succeeded"
    assert lines.of(LogStream.stdout) == ["x" * 200_000 + "END"]


def test_an_overlong_line_is_split_without_breaking_characters(tmp_path: Path) -> None:
    lines = Lines()
    cr = CommandRun(
        JobSpec(command=["printf", "%s", "é" * 50]),
        cwd=tmp_path,
        env=os.environ,
        on_line=lines,
        max_line_bytes=7,
    )
    assert asyncio.run(cr.run()).state == "succeeded"
    pieces = lines.of(LogStream.stdout)
    assert len(pieces) > 1
    assert "".join(pieces) == "é" * 50
    assert all(len(p.encode()) <= 7 for p in pieces)


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:
    outcome, lines = run(tmp_path, shell=r"printf 'a\377b\n'")
    assert outcome.state == "succeeded"
    assert lines.of(LogStream.stdout) == ["a\ufffdb"]


# --------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("shell", "expected"),
    [
        ("exit 0", RunOutcome("succeeded", 0, None)),
        ("exit 3", RunOutcome("failed", 3, "exit code 3")),
        ("kill -9 $$", RunOutcome("failed", -9, "killed by signal SIGKILL")),
    ],
)
def test_exit_status_maps_to_state(tmp_path: Path, shell: str, expected: RunOutcome) -> None:
    outcome, _ = run(tmp_path, shell=shell)
    assert outcome == expected


def test_missing_executable_fails_with_a_clear_reason(tmp_path: Path) -> None:
    outcome, lines = run(tmp_path, command=["nosuchcmd-gpulayer-test", "--flag"])
    reason = "cannot start 'nosuchcmd-gpulayer-test': No such file or directory"
    assert outcome == RunOutcome("failed", None, reason)
    assert lines.of(LogStream.system) == [reason]


def test_outcome_becomes_a_task_completion() -> None:
    completion = RunOutcome("failed", 3, "exit code 3").completion()
    assert (completion.state, completion.exit_code, completion.reason) == (
        "failed",
        3,
        "exit code 3",
    )


# ------------------------------------------------------- the process tree


def test_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    cr = command_run(tmp_path, Lines(), shell="sleep 100 & sleep 100", timeout=1.0)
    outcome, sleeps = asyncio.run(run_and_collect_sleeps(cr))
    assert outcome.state == "timed_out"
    assert outcome.reason == "timed out after 1.0s"
    assert all(gone(p) for p in sleeps)


def test_cancel_kills_the_whole_tree(tmp_path: Path) -> None:
    cr = command_run(tmp_path, Lines(), shell="sleep 100 & sleep 100")
    outcome, sleeps = asyncio.run(run_and_collect_sleeps(cr, cr.cancel))
    assert outcome.state == "cancelled"
    assert outcome.reason == "cancelled by user"
    assert all(gone(p) for p in sleeps)


def test_a_tree_that_ignores_sigterm_gets_sigkill(tmp_path: Path) -> None:
    # `trap '' TERM` makes the shell and both sleeps (which inherit it) ignore SIGTERM.
    cr = command_run(tmp_path, Lines(), shell="trap '' TERM; sleep 100 & sleep 100")
    outcome, sleeps = asyncio.run(
        run_and_collect_sleeps(cr, lambda: cr.cancel("worker shutting down"))
    )
    assert outcome.state == "cancelled"
    assert outcome.reason == "worker shutting down"
    assert all(gone(p) for p in sleeps)


def test_a_descendant_that_left_the_process_group_is_stopped_too(tmp_path: Path) -> None:
    cr = command_run(tmp_path, Lines(), shell="setsid sleep 100 & sleep 100")
    sessions: set[int] = set()

    def cancel() -> None:
        assert cr.pid is not None
        sessions.update(os.getsid(p.pid) for p in sleeps_in_tree(cr.pid))
        cr.cancel()

    outcome, sleeps = asyncio.run(run_and_collect_sleeps(cr, cancel))
    assert outcome.state == "cancelled"
    assert len(sessions) == 2  # one of the sleeps really left the task's session
    assert all(gone(p) for p in sleeps)


def test_children_lingering_after_a_normal_exit_are_stopped(tmp_path: Path) -> None:
    # The shell exits at once; its background child keeps the output pipe open.
    outcome, lines = run(tmp_path, shell="sleep 100 & echo $!")
    assert outcome == RunOutcome("succeeded", 0, None)
    (pid,) = lines.of(LogStream.stdout)
    assert not psutil.pid_exists(int(pid)) or gone(psutil.Process(int(pid)))


def test_cancel_before_start_never_starts_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cr = command_run(tmp_path, Lines(), command=["touch", str(marker)])
    cr.cancel()
    assert asyncio.run(cr.run()) == RunOutcome("cancelled", None, "cancelled by user")
    assert not marker.exists()


# -------------------------------------------------- task dir, env, bundles


def assignment(**spec: object) -> Assignment:
    return Assignment(
        task_id="t-1", job_id="j-1", attempt=2, spec=JobSpec(**spec), gpu_indices=[1, 3]
    )


def test_task_env_and_artifacts_are_visible_to_the_process(tmp_path: Path) -> None:
    script = (
        "import os, pathlib\n"
        "for k in ('GPULAYER_JOB_ID', 'GPULAYER_TASK_ID', 'GPULAYER_ATTEMPT',"
        " 'GPULAYER_ARTIFACTS', 'CUDA_VISIBLE_DEVICES', 'FOO', 'PYTHONUNBUFFERED'):\n"
        "    print(k, os.environ[k])\n"
        "print('TOKEN', os.environ.get('GPULAYER_TOKEN'))\n"
        "out = pathlib.Path(os.environ['GPULAYER_ARTIFACTS'], 'sub')\n"
        "out.mkdir()\n"
        "(out / 'result.txt').write_text('42')\n"
        "(out / 'link.txt').symlink_to(out / 'result.txt')\n"
    )
    a = assignment(
        command=[sys.executable, "-c", script], env={"FOO": "bar", "CUDA_VISIBLE_DEVICES": "7"}
    )
    task_dir = TaskDir.create(tmp_path / "tasks", a.task_id)
    env = task_env(a, task_dir.artifacts, base={**os.environ, "GPULAYER_TOKEN": "gl_secret"})
    lines = Lines()
    cr = CommandRun(a.spec, cwd=task_dir.work, env=env, on_line=lines)
    assert asyncio.run(cr.run()).state == "succeeded"
    seen = dict(line.split(" ", 1) for line in lines.of(LogStream.stdout))
    assert seen == {
        "GPULAYER_JOB_ID": "j-1",
        "GPULAYER_TASK_ID": "t-1",
        "GPULAYER_ATTEMPT": "2",
        "GPULAYER_ARTIFACTS": str(tmp_path / "tasks" / "t-1" / "artifacts"),
        "CUDA_VISIBLE_DEVICES": "1,3",  # the reservation wins over the job's env
        "FOO": "bar",
        "PYTHONUNBUFFERED": "1",
        "TOKEN": "None",  # the worker's credentials stay with the worker
    }
    assert task_dir.artifact_files() == [("sub/result.txt", task_dir.artifacts / "sub/result.txt")]
    task_dir.remove()
    assert not task_dir.root.exists()


def test_no_credential_of_the_worker_reaches_a_task(tmp_path: Path) -> None:
    token = "gl_" + "x" * 43
    worker_env = {
        **{name: "secret" for name in PRIVATE_ENV},
        "MY_OWN_NAME_FOR_IT": token,  # a gpulayer token under any name
        "PATH_LIKE": f"a:{token}:b",
        "PATH": "/usr/bin",
        "NOT_A_TOKEN": "gl_short",
    }
    a = assignment(command=["true"], env={"PASSED_ON_PURPOSE": token})
    env = task_env(a, tmp_path, base=worker_env)
    assert {"GPULAYER_JOIN_TOKEN", "JUPYTER_TOKEN", "JUPYTERHUB_API_TOKEN"} <= PRIVATE_ENV
    assert not set(worker_env) - {"PATH", "NOT_A_TOKEN"} & set(env)
    assert env["PATH"] == "/usr/bin" and env["NOT_A_TOKEN"] == "gl_short"
    assert env["PASSED_ON_PURPOSE"] == token  # the job's own env is the job's choice
    assert "GPULAYER_TOKEN" not in env and "GPULAYER_URL" not in env  # no api_access


def test_a_task_with_api_access_gets_its_own_token_and_where_to_use_it(tmp_path: Path) -> None:
    a = assignment(command=["true"], api_access=True).model_copy(update={"api_token": "gl_t"})
    where = ControlPlaneAddress("https://cp:8765/", "sha256:" + "0" * 64, insecure=False)
    env = task_env(a, tmp_path, base={"GPULAYER_TOKEN": "gl_worker_user"}, control_plane=where)
    assert env["GPULAYER_TOKEN"] == "gl_t" and env["GPULAYER_URL"] == "https://cp:8765/"
    assert env["GPULAYER_FINGERPRINT"] == where.fingerprint and "GPULAYER_INSECURE" not in env


def test_no_gpus_means_an_empty_cuda_visible_devices(tmp_path: Path) -> None:
    a = Assignment(task_id="t", job_id="j", attempt=1, spec=JobSpec(shell="true"))
    assert task_env(a, tmp_path, base={})["CUDA_VISIBLE_DEVICES"] == ""


def test_a_job_cannot_shed_or_forge_its_workers_fence_mark(tmp_path: Path) -> None:
    spec = JobSpec(shell="true", env={"GPULAYER_FENCE": "forged"})
    a = Assignment(task_id="t", job_id="j", attempt=1, spec=spec)
    assert task_env(a, tmp_path, base={"GPULAYER_FENCE": "f1"})["GPULAYER_FENCE"] == "f1"
    assert "GPULAYER_FENCE" not in task_env(a, tmp_path, base={})


def test_bundle_is_unpacked_as_the_cwd(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "hello.txt").write_text("hello from the bundle\n")
    (src / "pkg" / "data.txt").write_text("nested\n")
    task_dir = TaskDir.create(tmp_path / "tasks", "t-2")
    task_dir.unpack(bundle.pack(src))
    lines = Lines()
    spec = JobSpec(shell="cat hello.txt pkg/data.txt; pwd")
    cr = CommandRun(spec, cwd=task_dir.work, env=os.environ, on_line=lines)
    assert asyncio.run(cr.run()).state == "succeeded"
    assert lines.of(LogStream.stdout) == ["hello from the bundle", "nested", str(task_dir.work)]


# ----------------------------------------------------------- log shipping


class PartialServer:
    """Stores lines by seq like the control plane, dropping lines it already has, but
    takes only half of every other batch, so the shipper must resend the rest."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.calls = 0
        self.in_flight = 0
        self.largest_batch = 0

    async def send(self, batch: LogBatch) -> LogAck:
        self.calls += 1
        self.in_flight += 1
        assert self.in_flight == 1, "more than one request in flight"
        try:
            await asyncio.sleep(0)  # let the task add lines while a request is out
            assert batch.seq <= len(self.lines), "a gap in seq"
            self.largest_batch = max(self.largest_batch, len(batch.lines))
            take = (
                batch.lines if self.calls % 2 == 0 else batch.lines[: max(1, len(batch.lines) // 2)]
            )
            new = take[len(self.lines) - batch.seq :]
            self.lines.extend(line.text for line in new)
            return LogAck(next_seq=len(self.lines))
        finally:
            self.in_flight -= 1


def test_log_shipper_delivers_in_order_without_gaps_or_duplicates() -> None:
    async def scenario() -> PartialServer:
        server = PartialServer()
        shipper = LogShipper("t", server.send, batch_seconds=0.001)
        runner = asyncio.create_task(shipper.run())
        now = datetime.now().astimezone()
        for i in range(2500):
            shipper.add(LogStream.stdout, f"line {i}", now)
            if i % 700 == 0:
                await asyncio.sleep(0.002)
        shipper.add(LogStream.stderr, "y" * 70_000, now)  # over LogEntry's limit: two entries
        await shipper.flush()
        shipper.stop()
        await runner
        return server

    server = asyncio.run(scenario())
    assert server.lines[:2500] == [f"line {i}" for i in range(2500)]
    assert server.lines[2500:] == ["y" * 65536, "y" * (70_000 - 65536)]
    assert server.largest_batch <= 1000


def test_the_lines_left_at_a_tasks_end_ride_its_completion_unless_it_is_refused() -> None:
    async def scenario() -> tuple[list[LogBatch | None], PartialServer]:
        server = PartialServer()
        shipper = LogShipper("t", server.send, batch_seconds=60.0)
        runner = asyncio.create_task(shipper.run())
        now = datetime.now().astimezone()
        shipper.add(LogStream.system, "started", now)  # after a quiet spell: goes at once
        await until_async(lambda: server.lines == ["started"], 5)
        for i in range(3):  # gathered for batch_seconds: still here at the end
            shipper.add(LogStream.stdout, f"line {i}", now)
        first = await shipper.take_rest()
        shipper.taken(first, stored=False)  # the completion was refused: sent as usual
        await shipper.flush()
        shipper.add(LogStream.system, "artifact 'x' not stored", now)
        second = await shipper.take_rest()
        shipper.taken(second, stored=True)
        await shipper.flush()  # nothing left: returns at once
        shipper.stop()
        await runner
        return [first, second], server

    (first, second), server = asyncio.run(scenario())
    assert first is not None and first.seq == 1
    assert [e.text for e in first.lines] == ["line 0", "line 1", "line 2"]
    assert server.lines == ["started", "line 0", "line 1", "line 2"]
    assert second is not None and second.seq == 4
    assert [e.text for e in second.lines] == ["artifact 'x' not stored"]


def test_a_short_tasks_started_line_waits_to_ride_its_completion() -> None:
    async def scenario() -> tuple[LogBatch | None, PartialServer]:
        server = PartialServer()
        shipper = LogShipper("t", server.send, batch_seconds=60.0)
        runner = asyncio.create_task(shipper.run())
        shipper.add(LogStream.system, "started on w1", datetime.now().astimezone(), hold=True)
        await asyncio.sleep(0.05)  # a quiet spell: a line not held would have gone
        rest = await shipper.take_rest()
        shipper.taken(rest, stored=True)
        shipper.stop()
        await runner
        return rest, server

    rest, server = asyncio.run(scenario())
    assert server.calls == 0
    assert rest is not None and [e.text for e in rest.lines] == ["started on w1"]


def test_a_shipper_started_on_demand_runs_only_once_there_are_lines() -> None:
    """A call that prints nothing costs no shipping task; one that prints gets
    its lines shipped, and stopping the shipper ends its loop."""

    async def scenario() -> tuple[int, int, PartialServer]:
        server = PartialServer()
        shipper = LogShipper("t", server.send, batch_seconds=0.001)
        before = len(asyncio.all_tasks())
        shipper.start_on_demand()
        await shipper.flush()  # nothing queued: returns at once, starts nothing
        silent = len(asyncio.all_tasks()) - before
        now = datetime.now().astimezone()
        for i in range(3):
            shipper.add(LogStream.stdout, f"line {i}", now)
        await shipper.flush()
        shipper.stop()
        await asyncio.sleep(0)  # the loop's cancel lands
        await asyncio.sleep(0)
        left = len(asyncio.all_tasks()) - before
        return silent, left, server

    silent, left, server = asyncio.run(scenario())
    assert silent == 0
    assert server.lines == ["line 0", "line 1", "line 2"]
    assert left == 0


@contextlib.asynccontextmanager
async def session_cell(
    tmp_path: Path,
    source: str,
    batch_seconds: float,
    slow_first_line: bool = False,
    server: Any = None,
    timeout: float | None = None,
) -> AsyncIterator[tuple[CellTaskRun, LogShipper, Any, Kernel]]:
    """A cell of ``source`` in a real session kernel, its lines shipped to
    ``server`` (a :class:`PartialServer` by default); the shipper stops and the
    kernel ends after. ``slow_first_line``: the worker takes 50 ms over its first
    line (its CPU busy), so whatever the kernel sends next is waiting when it
    reads on."""
    server = server or PartialServer()
    shipper = LogShipper("t", server.send, batch_seconds=batch_seconds)
    runner = asyncio.create_task(shipper.run())
    spec = JobSpec(kind=JobKind.cell, cell=CellSpec(source=source, session="s"), timeout=timeout)
    a = Assignment(task_id="t", job_id="j", attempt=1, spec=spec, owner="ada")
    host = KernelHost()
    kernel = host.sessions[session_key(a, "s")] = Kernel(dict(os.environ), tmp_path)
    await kernel.start()
    try:
        on_line = shipper.add
        if slow_first_line:
            lines = 0

            def on_line(*args: Any, **kwargs: Any) -> None:
                nonlocal lines
                lines += 1
                if lines == 1:
                    time.sleep(0.05)
                shipper.add(*args, **kwargs)

        cell = CellTaskRun(host, a, env={}, cwd=tmp_path, scratch=tmp_path,
                           on_line=on_line)  # fmt: skip
        yield cell, shipper, server, kernel
    finally:
        shipper.stop()
        await runner
        await kernel.shutdown()


def _next_cell(kernel: Kernel, source: str, tmp_path: Path) -> CellTaskRun:
    """Another cell of ``source`` on the session kernel ``kernel``."""
    spec = JobSpec(kind=JobKind.cell, cell=CellSpec(source=source, session="s"))
    a = Assignment(task_id="t2", job_id="j2", attempt=1, spec=spec, owner="ada")
    host = KernelHost()
    host.sessions[session_key(a, "s")] = kernel
    return CellTaskRun(host, a, env={}, cwd=tmp_path, scratch=tmp_path,
                       on_line=lambda *args, **kwargs: None)  # fmt: skip


def test_a_session_cell_past_its_timeout_or_cancelled_is_interrupted_and_its_kernel_lives_on(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        sleeper = "import time; time.sleep(60)"
        async with session_cell(tmp_path, sleeper, 0.05, timeout=0.5) as (cell, _, _, kernel):
            timed = await cell.run()
            assert timed.state == "timed_out" and timed.reason == "timed out after 0.5 s"
            assert (await _next_cell(kernel, "x = 41 + 1", tmp_path).run()).state == "succeeded"
            busy = _next_cell(kernel, sleeper, tmp_path)
            running = asyncio.create_task(busy.run())
            await until_async(lambda: busy.pid is not None, 30)  # it has the kernel
            busy.cancel("cancelled by the test")
            cancelled = await asyncio.wait_for(running, 30)  # long before the sleep's end
            assert cancelled.state == "cancelled" and cancelled.reason == "cancelled by the test"
            assert (await _next_cell(kernel, "x", tmp_path).run()).state == "succeeded"

    asyncio.run(scenario())


def test_a_cells_first_output_goes_at_once_and_its_reply_rides_the_completion(
    tmp_path: Path,
) -> None:
    """A cell in a real session kernel: its first line after a quiet spell is sent at once
    (first output), its ``execute_reply`` waits for the task's completion to carry
    it (ADR 0143): one request fewer per cell."""

    async def scenario() -> tuple[list[str], LogBatch | None]:
        # The cell sleeps past batch_seconds: a line that is not held would go at once.
        source = "print('hi', flush=True); import time; time.sleep(0.6)"
        async with session_cell(tmp_path, source, 0.2) as (cell, shipper, server, _):
            outcome = await cell.run()
            assert outcome.state == "succeeded", outcome
            await asyncio.sleep(0.05)  # the worker's own steps before the completion
            rest = await shipper.take_rest()
            shipper.taken(rest, stored=True)
        return server.lines, rest

    sent, rest = asyncio.run(scenario())
    assert [json.loads(t)["msg_type"] for t in sent] == ["stream"]
    assert rest is not None
    assert [json.loads(e.text)["msg_type"] for e in rest.lines] == ["execute_reply"]


def test_a_cell_that_prints_and_ends_at_once_sends_its_output_before_its_end(
    tmp_path: Path,
) -> None:
    """A cell whose output is its last act: the kernel's ``idle`` and reply are
    there as soon as the output is, yet the output's line goes to the control plane
    first, on its own (the first output, as the caller waits for it), and only the
    ``execute_reply`` rides the completion."""

    class AckLater:
        """Records a batch as it is sent; acknowledges it once ``ack`` is set, as the
        control plane does after its commit."""

        def __init__(self) -> None:
            self.lines: list[str] = []
            self.ack = asyncio.Event()

        async def send(self, batch: LogBatch) -> LogAck:
            self.lines += [line.text for line in batch.lines]
            await self.ack.wait()
            return LogAck(next_seq=batch.seq + len(batch.lines))

    async def scenario() -> tuple[list[str], LogBatch | None]:
        later = AckLater()
        cell_in = session_cell(tmp_path, "print('hi')", 0.2, slow_first_line=True, server=later)
        async with cell_in as (cell, shipper, server, _):
            outcome = await cell.run()
            assert outcome.state == "succeeded", outcome
            rest_of = asyncio.create_task(shipper.take_rest())  # waits for that ack
            await asyncio.sleep(0)  # its first step holds the lines not sent yet
            later.ack.set()
            rest = await rest_of
            shipper.taken(rest, stored=True)
        return server.lines, rest

    sent, rest = asyncio.run(scenario())
    assert [json.loads(t)["msg_type"] for t in sent] == ["stream"]
    assert rest is not None
    assert [json.loads(e.text)["msg_type"] for e in rest.lines] == ["execute_reply"]


def test_output_written_at_a_cells_very_end_comes_before_its_reply(tmp_path: Path) -> None:
    """A session kernel flushes its streams at once when nothing is waiting (ADR
    0152), but never drops or delays what is: text without a newline on stdout and
    stderr, and text a thread wrote, all arrive before the cell's reply; a cell
    that writes nothing relays no output."""
    cells = {
        "tail": "print('a', end='')",
        "stderr": "import sys; sys.stderr.write('e')",
        "thread": "import threading; t = threading.Thread(target=print, args=('t',),"
        " kwargs={'end': ''}); t.start(); t.join()",
        "quiet": "x = 1",
        "after": "print('b', end='')",
    }

    async def scenario() -> dict[str, tuple[str, str, str]]:
        kernel = Kernel(dict(os.environ), tmp_path)
        await kernel.start()
        got = {}
        try:
            for name, source in cells.items():
                seen: list[KernelMessage] = []
                reply = await kernel.execute(source, seen.append)
                streams = {"stdout": "", "stderr": ""}
                for m in seen:
                    if m.msg_type == "stream":
                        streams[m.content["name"]] += m.content["text"]
                got[name] = (reply["status"], streams["stdout"], streams["stderr"])
        finally:
            await kernel.shutdown()
        return got

    got = asyncio.run(scenario())
    assert got == {
        "tail": ("ok", "a", ""),
        "stderr": ("ok", "", "e"),
        "thread": ("ok", "t", ""),
        "quiet": ("ok", "", ""),
        "after": ("ok", "b", ""),
    }


@pytest.mark.parametrize("worker_only", [True, False])
def test_only_a_kernel_no_frontend_sees_goes_without_busy_and_execute_input(
    tmp_path: Path, worker_only: bool
) -> None:
    """A cell's or session's kernel (only the worker reads it) publishes no ``busy``
    and no ``execute_input`` (ADR 0153); a kernel relayed to a frontend publishes
    both (JupyterLab shows busy from it). Seen by a second client on its iopub."""
    from jupyter_client.asynchronous import AsyncKernelClient

    async def scenario() -> list[str]:
        kernel = Kernel(dict(os.environ), tmp_path, worker_only=worker_only)
        await kernel.start()
        side = AsyncKernelClient()
        side.load_connection_info(kernel._km.get_connection_info())
        side.start_channels(shell=False, stdin=False, hb=False, control=False)
        try:
            seen: list[str] = []

            async def cell(code: str) -> str:
                before = len(seen)
                await kernel.execute(code, lambda m: None)
                while True:  # the side client's copy of this request's messages
                    msg = await side.get_iopub_msg(timeout=5)
                    seen.append(msg["msg_type"])
                    if msg["content"].get("execution_state") == "idle":
                        return ",".join(seen[before:])

            # The side subscription connects a moment after the kernel publishes.
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                with contextlib.suppress(Exception):
                    await cell("pass")
                    break
                assert asyncio.get_running_loop().time() < deadline, "no iopub for the side"
            seen.clear()
            await cell("print('x')")
            return seen
        finally:
            side.stop_channels()
            await kernel.shutdown()

    types = asyncio.run(scenario())
    assert "stream" in types and types[-1] == "status"
    if worker_only:
        assert "execute_input" not in types and types.count("status") == 1, types
    else:
        assert "execute_input" in types and types.count("status") == 2, types


# ------------------------------------------------------------- the start


def test_an_ended_command_is_reaped_not_left_a_zombie(tmp_path: Path) -> None:
    cr = command_run(tmp_path, Lines(), command=["true"])
    assert asyncio.run(cr.run()) == RunOutcome("succeeded", 0, None)
    assert cr.pid is not None
    assert not psutil.pid_exists(cr.pid)  # a zombie would still have its pid


@pytest.mark.parametrize("setpriv", [True, False], ids=["through setpriv", "forked"])
def test_a_command_dies_with_its_agent_even_without_a_fence(tmp_path: Path, setpriv: bool) -> None:
    # The agent here is a bare Python that runs one CommandRun (no supervisor):
    # only the parent-death signal can stop the command when it is killed -9.
    # "forked" is a worker without setpriv: the preexec_fn path (ADR 0130).
    agent = (
        "import asyncio, os, sys\n"
        + ("" if setpriv else "import gpulayer.worker.spawning as s; s._SETPRIV = None\n")
        + "from gpulayer.contracts import JobSpec\n"
        "from gpulayer.worker.process import CommandRun\n"
        "def line(stream, text, ts): print(text, flush=True)\n"
        "run = CommandRun(JobSpec(shell='echo $$; exec sleep 100'), cwd=os.getcwd(),"
        " env=os.environ, on_line=line)\n"
        "asyncio.run(run.run())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GPULAYER_FENCE"}
    with subprocess.Popen([sys.executable, "-c", agent], cwd=tmp_path, env=env, stdout=-1) as proc:
        try:
            assert proc.stdout is not None
            command = psutil.Process(int(proc.stdout.readline()))
        finally:
            proc.kill()
    until(lambda: gone(command), 10, "the command to die with its agent")


def test_a_reused_call_folder_never_changes_what_a_link_put_in_it_points_at(tmp_path: Path) -> None:
    """ADR 0145: a folder kept for the owner's next call is made private again, but
    through the folders themselves: a link a lingering process put in place of
    ``work/`` makes the reuse fail (a new folder is made), and what the link points
    at keeps its mode."""
    root = tmp_path / "tasks"
    root.mkdir()
    kept = TaskDir.create(root, "t1", own_home=False)
    assert kept.left_empty()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    elsewhere.chmod(0o755)
    kept.work.rmdir()
    kept.work.symlink_to(elsewhere)
    assert not kept.left_empty()  # what the worker checks when the call ends
    with pytest.raises(OSError):  # ... and what it meets if the link came later
        kept.reuse_as(root, "t2")
    assert (elsewhere.stat().st_mode & 0o777) == 0o755


def test_a_worker_keeps_few_empty_call_folders_whatever_the_number_of_owners(
    tmp_path: Path,
) -> None:
    """ADR 0145: at most four kept folders per owner and sixteen in all; a kept
    folder goes back only to its owner's next call."""
    from gpulayer.worker.functions import RunnerPool
    from gpulayer.worker.launch import Launcher
    from gpulayer.worker.record import TaskRecord

    async def nothing(_: str) -> bytes:
        return b""

    runners = RunnerPool(base_env={}, homes=tmp_path)
    launcher = Launcher(worker_name="w", tasks_root=tmp_path, runners=runners,
                        kernels=KernelHost(), blob=nothing, kill_grace_seconds=1.0)  # fmt: skip
    fn = {"format": 1, "python": "3.11", "name": "f", "payload": b"x"}
    call = JobSpec(kind=JobKind.function, function=fn)
    kept = 0
    for i in range(40):
        a = Assignment(task_id=f"t{i}", job_id="j", attempt=1, spec=call, owner=f"o{i % 10}")
        task = TaskRecord(a, LogShipper(a.task_id, PartialServer().send, batch_seconds=1.0),
                          send_metrics=nothing)  # fmt: skip
        task.dir = TaskDir.create(tmp_path, a.task_id, own_home=False)
        kept += launcher.park(task)
    assert kept == 16
    assert launcher._spare("o0") is not None and launcher._spare("nobody") is None


def test_a_cell_whose_kernel_is_shut_down_under_it_ends_saying_so(tmp_path: Path) -> None:
    """Ending a session while its cell runs: the cell fails naming its kernel's end,
    not a worker error."""

    async def scenario() -> RunOutcome:
        source = "print('running', flush=True); import time; time.sleep(30)"
        async with session_cell(tmp_path, source, 0.05) as (cell, _, server, kernel):
            run = asyncio.create_task(cell.run())
            await until_async(lambda: any("running" in t for t in server.lines), 30, "the cell")
            await kernel.shutdown()
            return await asyncio.wait_for(run, 30)

    outcome = asyncio.run(scenario())
    assert outcome.state == "failed" and "kernel" in (outcome.reason or ""), outcome


def test_a_session_ended_as_its_successor_arrives_leaves_the_successor_awaited(
    tmp_path: Path,
) -> None:
    """``%gpulayer end s`` then a new session ``s`` on the same worker: the new
    session's assignment comes while the old kernel still shuts down. The old run's
    end no longer tells the new session's waiting cells that no kernel will come
    (before, a first cell in the new session failed with "session 's' is not
    running on this worker")."""

    async def scenario() -> object:
        spec = JobSpec(kind=JobKind.session, session=SessionSpec(name="s"))
        a = Assignment(task_id="t1", job_id="j1", attempt=1, spec=spec, owner="ada")
        host, key = KernelHost(), session_key(a, "s")
        old = SessionRun(host, a, env=dict(os.environ), cwd=tmp_path, on_line=lambda *_: None)
        running = asyncio.create_task(old.run())
        await until_async(lambda: key in host.sessions, 60, "the old session's kernel")
        old.cancel("ended by ada")
        host.expect(key)  # the new session's assignment, before the old run has ended
        waiting = asyncio.create_task(host.kernel(key))  # its first cell
        outcome = await asyncio.wait_for(running, 60)
        assert outcome.state == "succeeded", outcome
        assert not waiting.done()  # still waiting for the new kernel
        new_kernel = object()
        host.started(key, new_kernel)  # type: ignore[arg-type]  # the new session's kernel is up
        return (await waiting) is new_kernel

    assert asyncio.run(scenario())
