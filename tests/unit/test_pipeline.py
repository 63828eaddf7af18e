"""The task pipeline drives every kind of run through one path: a fake control
plane (the uplink) and fake runs, so each test checks one step of that path."""

import asyncio
import hashlib
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gpulayer.contracts import (
    Acquired,
    Artifact,
    Assignment,
    CellSpec,
    JobKind,
    JobSpec,
    LogAck,
    LogBatch,
    LogStream,
    TaskCompletion,
)
from gpulayer.errors import NotFound
from gpulayer.worker.pipeline import Pipeline
from gpulayer.worker.record import TaskRecord
from gpulayer.worker.runs import RunOutcome

DEADLINE_SECONDS = 10.0


class FakeUplink:
    """Takes logs and completions as the control plane would."""

    def __init__(self) -> None:
        self.lines: dict[str, list[tuple[LogStream, str]]] = {}
        self.completed: dict[str, asyncio.Future[TaskCompletion]] = {}

    def completion(self, task_id: str) -> "asyncio.Future[TaskCompletion]":
        return self.completed.setdefault(task_id, asyncio.get_running_loop().create_future())

    async def call(self, method: str, route: str, **kw: Any) -> httpx.Response:
        _, task_id, what = route.split("/")
        if what == "logs":
            batch: LogBatch = kw["body"]
            self.lines.setdefault(task_id, []).extend((e.stream, e.text) for e in batch.lines)
            ack = LogAck(next_seq=batch.seq + len(batch.lines))
            return httpx.Response(200, json=ack.model_dump(mode="json"))
        assert what == "complete", route
        done: TaskCompletion = kw["body"]
        if done.logs is not None:  # the last lines ride the completion, stored first
            self.lines.setdefault(task_id, []).extend((e.stream, e.text) for e in done.logs.lines)
        self.completion(task_id).set_result(done)
        return httpx.Response(409)  # the pipeline only logs a refused completion


class FakeRun:
    """Runs until cancelled or released; remembers what it was told."""

    pid = None

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()
        self.cancel_reason: str | None = None
        self.interrupted = False

    def cancel(self, reason: str) -> None:
        self.cancel_reason = self.cancel_reason or reason
        self.finish.set()

    def interrupt(self) -> None:
        self.interrupted = True

    async def run(self) -> RunOutcome:
        self.started.set()
        await self.finish.wait()
        if self.cancel_reason is not None:
            return RunOutcome("cancelled", None, self.cancel_reason)
        return RunOutcome("succeeded", 0)


class FakeLauncher:
    """Prepares a :class:`FakeRun` per task (made when the task arrives); ``hold``
    keeps a task in preparation, ``error`` fails every preparation."""

    def __init__(self) -> None:
        self.runs: dict[str, FakeRun] = {}
        self.preparing: dict[str, asyncio.Event] = {}
        self.hold: dict[str, asyncio.Event] = {}
        self.error: Exception | None = None

    def expect(self, assignment: Assignment) -> None:
        self.preparing[assignment.task_id] = asyncio.Event()
        self.runs[assignment.task_id] = FakeRun()

    async def prepare(self, task: TaskRecord) -> FakeRun:
        self.preparing[task.id].set()
        if task.id in self.hold:
            await self.hold[task.id].wait()
        if self.error is not None:
            raise self.error
        return self.runs[task.id]


async def no_heartbeat(*, retry: bool = True) -> bool:
    return True


def assignment(task_id: str, spec: JobSpec | None = None) -> Assignment:
    spec = spec or JobSpec(command=["true"])
    return Assignment(task_id=task_id, job_id=f"job-{task_id}", attempt=1, spec=spec)


def drive(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(test, DEADLINE_SECONDS))


def pipeline(slots: int = 1) -> tuple[Pipeline, FakeUplink, FakeLauncher]:
    uplink, launcher = FakeUplink(), FakeLauncher()
    pipe = Pipeline(
        uplink,  # type: ignore[arg-type]  # a fake with Uplink's one method used here
        launcher,  # type: ignore[arg-type]  # a fake with Launcher's two methods
        slots=slots,
        log_batch_seconds=0.001,
        heartbeat=no_heartbeat,
    )
    return pipe, uplink, launcher


def test_a_run_is_prepared_run_and_completed() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        pipe.start(assignment("t1"))
        task = pipe.tasks["t1"]
        await launcher.runs["t1"].started.wait()
        assert task.run is launcher.runs["t1"]
        launcher.runs["t1"].finish.set()
        done = await uplink.completion("t1")
        assert (done.state, done.exit_code) == ("succeeded", 0)
        assert task.pipeline is not None
        await task.pipeline
        assert "t1" not in pipe.tasks  # forgotten once delivered

    drive(main())


def test_a_cancel_while_the_run_is_prepared_reaches_the_run() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        launcher.hold["t1"] = asyncio.Event()
        pipe.start(assignment("t1"))
        await launcher.preparing["t1"].wait()
        pipe.tasks["t1"].cancel("cancelled by user")
        launcher.hold["t1"].set()
        done = await uplink.completion("t1")
        assert (done.state, done.reason) == ("cancelled", "cancelled by user")
        assert launcher.runs["t1"].cancel_reason == "cancelled by user"

    drive(main())


def test_a_task_cancelled_while_it_waits_for_a_slot_is_never_prepared() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline(slots=1)
        pipe.start(assignment("first"))
        await launcher.runs["first"].started.wait()
        pipe.start(assignment("second"))
        pipe.tasks["second"].cancel("cancelled by user")
        launcher.runs["first"].finish.set()  # frees the slot
        assert (await uplink.completion("first")).state == "succeeded"
        done = await uplink.completion("second")
        assert (done.state, done.reason) == ("cancelled", "cancelled by user")
        assert not launcher.preparing["second"].is_set()

    drive(main())


def test_a_cell_in_a_session_runs_without_taking_a_slot() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline(slots=1)
        pipe.start(assignment("busy"))
        await launcher.runs["busy"].started.wait()
        cell = JobSpec(kind=JobKind.cell, cell=CellSpec(source="1 + 1", session="s"))
        pipe.start(assignment("cell", cell))
        await launcher.preparing["cell"].wait()
        launcher.runs["cell"].finish.set()
        assert (await uplink.completion("cell")).state == "succeeded"
        launcher.runs["busy"].finish.set()
        assert (await uplink.completion("busy")).state == "succeeded"

    drive(main())


def test_a_bundle_that_cannot_be_had_fails_the_task_with_a_system_line() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        launcher.error = NotFound("bundle abc is not on the control plane", field="bundle")
        pipe.start(assignment("t1"))
        done = await uplink.completion("t1")
        assert (done.state, done.reason) == ("failed", "bundle abc is not on the control plane")
        assert (LogStream.system, done.reason) in uplink.lines["t1"]

    drive(main())


def test_interrupt_reaches_the_run() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        pipe.start(assignment("t1"))
        await launcher.runs["t1"].started.wait()
        pipe.tasks["t1"].interrupt()
        assert launcher.runs["t1"].interrupted
        launcher.runs["t1"].finish.set()
        await uplink.completion("t1")

    drive(main())


def test_released_tasks_report_lost_so_they_are_retried() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        pipe.start(assignment("t1"))
        await launcher.runs["t1"].started.wait()
        await pipe.release(timeout=DEADLINE_SECONDS)
        done = await uplink.completion("t1")
        assert (done.state, done.reason) == ("lost", "worker shutting down")
        assert not pipe.tasks

    drive(main())


# ------------------------------------------------ artifacts that cannot be stored


class StoringUplink(FakeUplink):
    """Also takes artifact uploads, answering each with the next of ``answers``
    (a status, or "wrong" for a 201 that names other content); 201 once they run out."""

    def __init__(self, *answers: int | str) -> None:
        super().__init__()
        self.answers = list(answers)
        self.stored: dict[str, bytes] = {}

    async def call(self, method: str, route: str, **kw: Any) -> httpx.Response:
        if "/artifacts/" not in route:
            return await super().call(method, route, **kw)
        name = route.split("/artifacts/", 1)[1]
        data = b"".join([chunk async for chunk in kw["content"]()])
        assert kw["headers"]["Content-Length"] == str(len(data))
        status = self.answers.pop(0) if self.answers else 201
        if status == 507:
            full = "the control plane's disk is full (/d/blobs)"
            return httpx.Response(507, json={"code": "storage_full", "message": full})
        sha = hashlib.sha256(b"other" if status == "wrong" else data).hexdigest()
        self.stored[name] = data
        art = Artifact(name=name, sha256=sha, size=len(data), created_at=datetime.now(UTC))
        return httpx.Response(201, json=art.model_dump(mode="json"))


class ArtifactLauncher(FakeLauncher):
    """Gives each task a folder with one artifact, ``model.pt``."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    async def prepare(self, task: TaskRecord) -> FakeRun:
        folder = await task.make_dir(self.root)
        (folder.artifacts / "model.pt").write_bytes(b"weights" * 1000)
        return await super().prepare(task)


def deliver_artifact(uplink: StoringUplink, tmp_path: Path) -> TaskCompletion:
    async def main() -> TaskCompletion:
        launcher = ArtifactLauncher(tmp_path)
        pipe = Pipeline(
            uplink,  # type: ignore[arg-type]  # a fake with Uplink's one method used here
            launcher,  # type: ignore[arg-type]  # a fake with Launcher's two methods
            slots=1,
            log_batch_seconds=0.001,
            heartbeat=no_heartbeat,
            storage_retry_seconds=0.5,
        )
        pipe.start(assignment("t1"))
        await launcher.runs["t1"].started.wait()
        launcher.runs["t1"].finish.set()
        return await uplink.completion("t1")

    return asyncio.run(asyncio.wait_for(main(), DEADLINE_SECONDS))


def test_an_artifact_the_full_control_plane_never_stores_fails_the_task_naming_it(
    tmp_path: Path,
) -> None:
    uplink = StoringUplink(*[507] * 100)
    done = deliver_artifact(uplink, tmp_path)
    why = (
        "artifact 'model.pt' not stored: HTTP 507 storage_full:"
        " the control plane's disk is full (/d/blobs)"
    )
    assert (done.state, done.exit_code, done.reason, done.retry) == ("failed", 0, why, False)
    assert (LogStream.system, why) in uplink.lines["t1"]
    assert len(uplink.answers) < 100  # retried while it waited


def test_an_artifact_stored_once_space_is_back_lets_the_task_succeed(tmp_path: Path) -> None:
    uplink = StoringUplink(507, 507)
    done = deliver_artifact(uplink, tmp_path)
    assert (done.state, done.reason) == ("succeeded", None)
    assert uplink.stored["model.pt"] == b"weights" * 1000


def test_an_artifact_stored_as_other_content_is_resent_then_fails_the_task(
    tmp_path: Path,
) -> None:
    assert deliver_artifact(StoringUplink("wrong"), tmp_path).state == "succeeded"
    done = deliver_artifact(StoringUplink("wrong", "wrong", "wrong"), tmp_path)
    assert done.state == "failed"
    assert done.reason is not None and "artifact 'model.pt' arrived corrupt" in done.reason


def test_a_cancel_in_the_answer_that_starts_its_task_stops_it_before_it_runs() -> None:
    """A call started at its submit and cancelled at once: one acquire answer
    carries its assignment and its cancel. The task is cancelled, never prepared,
    where the cancel used to find no such task and the call ran until a heartbeat
    sent the cancel again."""

    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        pipe.take(Acquired(assignments=[assignment("t1")], cancel=["t1"], seq=1))
        done = await uplink.completion("t1")
        assert (done.state, done.reason) == ("cancelled", "cancelled by user")
        assert not launcher.preparing["t1"].is_set()

    drive(main())


def test_an_interrupt_in_the_answer_that_starts_its_task_finds_it() -> None:
    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        launcher.hold["t1"] = asyncio.Event()
        pipe.take(Acquired(assignments=[assignment("t1")], seq=1))
        await launcher.preparing["t1"].wait()
        launcher.hold["t1"].set()
        await launcher.runs["t1"].started.wait()
        pipe.take(Acquired(assignments=[assignment("t1")], interrupt=["t1"], seq=2))
        assert launcher.runs["t1"].interrupted
        assert len(launcher.runs) == 1  # the re-sent assignment did not start it again
        launcher.runs["t1"].finish.set()
        assert (await uplink.completion("t1")).state == "succeeded"

    drive(main())


def test_an_interrupt_while_the_run_is_prepared_reaches_the_run() -> None:
    """Ctrl-C right after a cell was sent: its kernel is still being had. The
    interrupt waits for the run (a cell's run then ends ``cancelled`` before it
    executes anything), where it used to be dropped and the cell ran on."""

    async def main() -> None:
        pipe, uplink, launcher = pipeline()
        launcher.hold["t1"] = asyncio.Event()
        pipe.start(assignment("t1"))
        await launcher.preparing["t1"].wait()
        pipe.tasks["t1"].interrupt()
        launcher.hold["t1"].set()
        await launcher.runs["t1"].started.wait()
        assert launcher.runs["t1"].interrupted
        launcher.runs["t1"].finish.set()
        await uplink.completion("t1")

    drive(main())
