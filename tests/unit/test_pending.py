"""A queued job explains itself: at once when nothing could ever run it, within ~2 s
otherwise, again when the reason changes, in every place people wait (CLI, Job.wait,
cells, the widget); the control plane is a mock transport."""

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpulayer import cli, client, contracts
from gpulayer.client import cells
from gpulayer.client.pending import GPU_HINT, WORKER_HINT, PendingNotes, why_queued

from ..support import Clock

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
NO_GPU = "local-1: needs 1 × GPU, has no GPUs"
UNSAT = "unsatisfiable: no registered worker could ever run this job"


@pytest.fixture(autouse=True)
def gl_no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_CONFIG", str(tmp_path / "connection.json"))


def job(state: str = "queued", gpus: int = 1, **kw: object) -> contracts.Job:
    fields: dict[str, object] = {
        "id": "j1", "state": state, "owner": "ada", "created_at": NOW, "updated_at": NOW,
        "spec": {"command": ["true"], "resources": {"gpus": gpus}},
    }  # fmt: skip
    return contracts.Job.model_validate({**fields, **kw})


def stuck(gpus: int = 1) -> contracts.Job:
    return job(gpus=gpus, reason=UNSAT, unsatisfiable=True, pending_reasons=[NO_GPU])


def mock(routes: dict[str, list[contracts.BaseModel]]) -> client.Connection:
    """Answers ``METHOD path`` with the listed models in turn (the last one repeats)."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/gpulayer/api/v1/")
        answers = routes[f"{request.method} {path}"]
        model = answers.pop(0) if len(answers) > 1 else answers[0]
        status = 201 if request.method == "POST" and path == "jobs" else 200
        return httpx.Response(status, content=model.model_dump_json().encode())

    return client.Connection("http://cp/", "gl_t", transport=httpx.MockTransport(handle))


def test_an_unsatisfiable_job_is_explained_at_once_with_what_to_do() -> None:
    clock = Clock(100.0)
    notes = PendingNotes(clock=clock)
    line = notes.note(stuck())
    assert line == f"job j1 cannot start: {UNSAT} ({NO_GPU}); {GPU_HINT}"
    assert "gpulayer up --simulated-gpus" in line
    assert notes.note(stuck()) is None  # said once while nothing changes
    cpu = stuck(gpus=0).model_copy(update={"pending_reasons": ["w: needs 64 CPUs, has 4"]})
    text = why_queued(cpu)
    assert text is not None and text.endswith(WORKER_HINT) and "simulated" not in text


def test_a_waiting_job_is_explained_after_two_seconds_and_again_when_it_changes() -> None:
    clock = Clock(100.0)
    notes = PendingNotes(clock=clock)
    busy = job(pending_reasons=["local-1: all 4 task slots busy"])
    assert notes.note(busy) is None
    clock.now += 2.0
    assert notes.note(busy) == "job j1 queued: local-1: all 4 task slots busy"
    clock.now += 5.0
    assert notes.note(busy) is None
    behind = job(pending_reasons=["local-1: all 4 task slots busy", "behind 1 queued job"])
    assert notes.note(behind) == (
        "job j1 queued: local-1: all 4 task slots busy; behind 1 queued job"
    )
    assert notes.note(job("running")) is None


def test_submit_prints_the_id_and_warns_at_once_when_nothing_could_run_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = mock({"POST jobs": [stuck()]})
    assert cli.main(["submit", "--gpus", "1", "--", "true"], connection=conn) == 0
    out, err = capsys.readouterr()
    assert out == "j1\n"
    assert err == f"gpulayer: warning: job j1 cannot start: {UNSAT} ({NO_GPU}); {GPU_HINT}\n"


def test_submit_follow_says_why_it_waits_then_follows(capsys: pytest.CaptureFixture[str]) -> None:
    ended = job("succeeded", started_at=NOW, ended_at=NOW, exit_code=0)
    conn = mock({
        "POST jobs": [stuck()],
        "GET jobs/j1": [stuck(), job("running", started_at=NOW)],
        "GET jobs/j1/logs": [contracts.LogPage(lines=[], next_offset=0, complete=True)],
        "GET jobs/j1/wait": [ended],
    })  # fmt: skip
    assert cli.main(["submit", "-f", "--gpus", "1", "--", "true"], connection=conn) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "job j1 submitted"
    assert err[1].startswith(f"job j1 cannot start: {UNSAT}")
    assert err[2].startswith("job j1 succeeded")


def test_job_wait_says_why_it_is_still_queued() -> None:

    def no_hold(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/wait"):
            return httpx.Response(204)
        return httpx.Response(200, content=stuck().model_dump_json().encode())

    conn = client.Connection("http://cp/", "gl_t", transport=httpx.MockTransport(no_hold))
    with pytest.raises(TimeoutError) as e:
        client.Job(conn, job()).wait(timeout=0.01)
    assert str(e.value).startswith(f"job j1 did not end within 0.01s (cannot start: {UNSAT}")
    assert NO_GPU in str(e.value)


def test_job_wait_without_a_timeout_says_why_while_it_waits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ended = job("succeeded", started_at=NOW, ended_at=NOW, exit_code=0)
    conn = mock({
        "GET jobs/j1": [stuck(), job("running", started_at=NOW)],
        "GET jobs/j1/wait": [ended],
    })  # fmt: skip
    assert client.Job(conn, job()).wait().info.state == "succeeded"
    err = capsys.readouterr().err.splitlines()
    assert err == [f"[gpulayer] job j1 cannot start: {UNSAT} ({NO_GPU}); {GPU_HINT}"]


def test_a_remote_calls_result_says_why_it_waits(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayer.functions.calls import Call

    conn = mock({"GET jobs/j1": [stuck()], "GET jobs/j1/wait": [stuck()]})
    with pytest.raises(TimeoutError, match=r"did not end within 0.5s \(cannot start: "):
        Call(conn, job(), "train", None).result(timeout=0.5)
    assert capsys.readouterr().err.startswith(f"[gpulayer] job j1 cannot start: {UNSAT}")


def test_a_cell_that_cannot_start_says_so_before_the_first_wait() -> None:
    spec = contracts.JobSpec(kind="cell", cell={"source": "1"}, resources={"gpus": 4})
    cell = stuck().model_copy(update={"spec": spec})
    holds: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        holds.append(float(request.url.params.get("wait", 0)))
        page = contracts.LogPage(lines=[], next_offset=0, complete=True)
        return httpx.Response(200, content=page.model_dump_json().encode())

    conn = client.Connection("http://cp/", "gl_t", transport=httpx.MockTransport(handle))
    said: list[str] = []
    list(cells.RemoteCell(conn, cell).messages(on_line=lambda line: said.append(line.text)))
    assert said == [f"job j1 cannot start: {UNSAT} ({NO_GPU}); {GPU_HINT}"]
    assert holds == [1.0]  # a short hold while it has not started, not a 30 s one


def test_the_job_monitor_says_a_job_cannot_start_and_what_to_do() -> None:
    from gpulayer.notebook.widgets import JobMonitor

    mon = JobMonitor(client.Job(mock({}), stuck()))
    assert mon.reasons.value.startswith(f"<b>cannot start</b>: {UNSAT}")
    assert "gpulayer up --simulated-gpus" in mon.reasons.value and NO_GPU in mon.reasons.value


def test_job_details_say_what_to_do_about_an_unsatisfiable_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = mock({"GET jobs/j1": [stuck()], "GET jobs/j1/events": [contracts.EventList(events=[])]})
    assert cli.main(["job", "j1"], connection=conn) == 0
    out = capsys.readouterr().out
    assert f"why it is waiting:\n  {NO_GPU}\n  (no worker could ever run it: {GPU_HINT})\n" in out


def test_a_remote_call_that_cannot_start_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayer.functions.calls import Call

    conn = mock({
        "GET jobs/j1": [stuck(), job("running", started_at=NOW)],
        "GET jobs/j1/logs": [contracts.LogPage(lines=[], next_offset=0, complete=True)],
    })  # fmt: skip
    Call(conn, stuck(), "train", None).follow()
    err = capsys.readouterr().err
    assert err.startswith(f"[gpulayer] job j1 cannot start: {UNSAT} ({NO_GPU}); {GPU_HINT}\n")
