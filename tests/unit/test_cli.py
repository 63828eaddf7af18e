"""The `gpulayer` command line: one-line errors, exit codes, and output over a mock transport."""

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpulayer import cli, client, contracts
from gpulayer.cli.cluster import free_port

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture(autouse=True)
def gl_no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never read the user's own connection file or environment."""
    monkeypatch.setenv("GPULAYER_CONFIG", str(tmp_path / "connection.json"))
    monkeypatch.delenv("GPULAYER_URL", raising=False)
    monkeypatch.delenv("GPULAYER_TOKEN", raising=False)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpulayer: error: ")
    assert "Traceback" not in err
    return lines[0]


def job(state: str = "queued", **kw: object) -> contracts.Job:
    fields: dict[str, object] = {
        "id": "j1", "spec": {"command": ["true"], "name": "train"}, "state": state,
        "owner": "admin", "created_at": NOW, "updated_at": NOW,
    }  # fmt: skip
    return contracts.Job.model_validate({**fields, **kw})


def mock(routes: dict[str, list[contracts.BaseModel]]) -> client.Connection:
    """A connection answering ``METHOD path-suffix`` with the listed models in turn."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/gpulayer/api/v1/")
        answers = routes[f"{request.method} {path}"]
        model = answers.pop(0) if len(answers) > 1 else answers[0]
        status = 201 if request.method == "POST" and path == "jobs" else 200
        return httpx.Response(status, content=model.model_dump_json().encode())

    return client.Connection("http://cp/", "gl_t", transport=httpx.MockTransport(handle))


def test_a_bad_timeout_is_one_usage_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--url", "http://127.0.0.1:9", "--token", "t",
                     "submit", "--timeout", "abc", "--", "true"])  # fmt: skip
    assert code == 2
    assert "--timeout" in one_error_line(capsys)


def test_an_unreachable_control_plane_is_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    assert cli.main(["jobs", "--url", url, "--token", "gl_t"]) == 1
    assert f"cannot reach the gpulayer control plane at {url}" in one_error_line(capsys)


def test_submit_without_a_command_says_how(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--url", "http://127.0.0.1:9", "--token", "t", "submit", "--gpus", "1"]) == 2
    assert "put it after `--`" in one_error_line(capsys)


def test_a_command_without_dashes_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["submit", "python", "-c", "print(1)"]) == 2
    assert "put the command after `--`" in one_error_line(capsys)


def test_no_configuration_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["workers"]) == 1
    assert "gpulayer up" in one_error_line(capsys)


def test_a_bad_option_value_names_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    conn = mock({})
    assert cli.main(["submit", "--gpus", "-1", "--", "true"], connection=conn) == 2
    assert "resources.gpus" in one_error_line(capsys)


def test_submit_prints_only_the_job_id(capsys: pytest.CaptureFixture[str]) -> None:
    conn = mock({"POST jobs": [job()]})
    assert cli.main(["submit", "--", "python", "-c", "print(1)"], connection=conn) == 0
    assert capsys.readouterr().out == "j1\n"


def test_submit_follow_streams_by_stream_and_exits_like_the_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [
        contracts.LogLine(offset=0, stream="stdout", ts=NOW, text="out"),
        contracts.LogLine(offset=1, stream="stderr", ts=NOW, text="err"),
    ]
    ended = job("failed", exit_code=3, started_at=NOW, ended_at=NOW, reason="exit code 3")
    conn = mock({
        "POST jobs": [job()],
        "GET jobs/j1/logs": [
            contracts.LogPage(lines=lines, next_offset=2, complete=True),
            contracts.LogPage(lines=[], next_offset=2, complete=True),
        ],
        "GET jobs/j1/wait": [ended],
    })  # fmt: skip
    assert cli.main(["submit", "-f", "--shell", "echo out; echo err >&2; exit 3"],
                    connection=conn) == 3  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out == "out\n"
    assert "err\n" in captured.err
    assert captured.err.splitlines()[-1] == "job j1 failed in 0ms (exit 3): exit code 3"


def test_jobs_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    conn = mock({"GET jobs": [contracts.JobList(jobs=[job("succeeded", exit_code=0)])]})
    assert cli.main(["jobs"], connection=conn) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "NAME", "STATE", "WORKER", "EXIT", "AGE", "DURATION"]
    assert row.split()[:5] == ["j1", "train", "succeeded", "-", "0"]


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "submit" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["join", "http://127.0.0.1:9", "--token", "t", "--slots", "0"], "--slots: 0 is out of"),
        (["join", "http://127.0.0.1:9", "--token", "t", "--warm-runners", "-1"], "--warm-runners"),
        (["join", "http://127.0.0.1:9", "--token", "t", "--runner-max-calls", "0"], "max-calls"),
        (["join", "http://127.0.0.1:9", "--token", "t", "--register-timeout", "x"], "not a number"),
        (["up", "--slots", "0"], "--slots: 0 is out of range; give an integer >= 1"),
        (["up", "--local-workers", "-1"], "--local-workers"),
        (["up", "--port", "99999"], "from 1 to 65535"),
        (["jobs", "--limit", "0"], "--limit"),
        (["logs", "j1", "--rank", "-1"], "--rank"),
        (["submit", "--gpus", "-1", "--", "true"], "resources.gpus"),
        (["submit", "--nodes", "0", "--", "true"], "nodes"),
        (["submit", "--priority", "x", "--", "true"], "--priority"),
        (["token", "create", "x", "--role", "admin", "--expires", "soon"], "expires:"),
        (["token", "create", "x", "--role", "admin", "--single-use"], "single-use"),
    ],
)
def test_every_bad_flag_is_one_error_line_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--url", "http://127.0.0.1:9", "--token", "t", *argv])
    assert code == 2
    assert words in one_error_line(capsys)


def test_join_gives_up_on_an_unreachable_first_registration(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    code = cli.main(["join", url, "--token", "gl_join", "--name", "w", "--warm-runners", "0",
                     "--data-dir", str(tmp_path), "--register-timeout", "1"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("gpulayer: error: ")]
    assert errors == [
        f"gpulayer: error: cannot register with the control plane at {url}: no answer within"
        " 1s; check the URL and that the control plane is up (--register-timeout waits longer)"
    ]
    assert "Traceback" not in err
