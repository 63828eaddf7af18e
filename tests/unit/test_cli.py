"""The `gpulayer` command line: one-line errors, exit codes, and output over a mock transport."""

import argparse
import io
import os
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpulayer import cli, client, contracts
from gpulayer.cli import up
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


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--lease-seconds", "3"], "--lease-seconds (3) must be more than twice"),
        (["--heartbeat-seconds", "7"], "--lease-seconds (12) must be more than twice"),
        (["--heartbeat-seconds", "0"], "--heartbeat-seconds must be above 0"),
    ],
)
def test_up_refuses_a_lease_a_worker_cannot_keep_before_starting_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], says: str
) -> None:
    assert cli.main(["up", "--data-dir", str(tmp_path / "up"), *flags]) == 2
    assert says in one_error_line(capsys)
    assert not (tmp_path / "up").exists()


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
        "GET jobs/j1": [job("running", started_at=NOW)],
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


ESC = "\x1b"
HOSTILE = {
    "colour (CSI SGR)": (f"{ESC}[31mred{ESC}[0m", "red"),
    "cursor up and erase line": (f"ok{ESC}[1A{ESC}[2K", "ok"),
    "private mode (hide cursor)": (f"{ESC}[?25lx", "x"),
    "window title (OSC, BEL)": (f"{ESC}]0;pwned{chr(7)}title", "title"),
    "hyperlink (OSC 8, ST)": (f"{ESC}]8;;http://evil/{ESC}\\click{ESC}]8;;{ESC}\\", "click"),
    "unended OSC stops at the line end": (f"a{ESC}]52;c;Y2xpcA==\nb", "a\nb"),
    "device control string": (f"{ESC}P+q544e{ESC}\\x", "x"),
    "8-bit CSI and OSC": ("\x9b2J\x9d0;t\x07y", "y"),
    "charset and reset escapes": (f"{ESC}(0{ESC}cz", "z"),
    "carriage return, backspace, bell, NUL, DEL": ("a\rb\bc\x07d\x00e\x7f", "abcde"),
    "newline and tab stay": ("a\tb\nc", "a\tb\nc"),
    "unicode stays": ("ünïcødé ✓ 中文", "ünïcødé ✓ 中文"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_plain_strips_terminal_control(case: str) -> None:
    text, want = HOSTILE[case]
    assert cli.output.plain(text) == want


def test_tables_notes_and_errors_strip_control_and_keep_rows_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cli.output.table(("NAME", "REASON"), [(f"{ESC}]0;x{chr(7)}w1", f"a\nb{ESC}[2J")])
    out = capsys.readouterr().out
    assert ESC not in out and out.splitlines()[1].split() == ["w1", "a", "b"]
    cli.output.note(f"job ended: {ESC}[31mboom")
    assert capsys.readouterr().err == "job ended: boom\n"
    cli.output.fail(f"no job {ESC}[8mhidden", 1)
    assert capsys.readouterr().err == "gpulayer: error: no job hidden\n"


def log_page(*texts: str) -> contracts.LogPage:
    lines = [contracts.LogLine(offset=i, stream="stdout", ts=NOW, text=t)
             for i, t in enumerate(texts)]  # fmt: skip
    return contracts.LogPage(lines=lines, next_offset=len(lines), complete=True)


def test_logs_strip_escapes_unless_raw(capsys: pytest.CaptureFixture[str]) -> None:
    page = log_page(f"{ESC}[31mred{ESC}[0m", f"{ESC}]0;title{chr(7)}plain")
    assert cli.main(["logs", "j1"], connection=mock({"GET jobs/j1/logs": [page]})) == 0
    assert capsys.readouterr().out == "red\nplain\n"
    assert cli.main(["logs", "j1", "--raw"], connection=mock({"GET jobs/j1/logs": [page]})) == 0
    assert capsys.readouterr().out == f"{ESC}[31mred{ESC}[0m\n{ESC}]0;title{chr(7)}plain\n"


def test_job_details_and_follow_strip_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    evil = f"{ESC}[2J{ESC}]0;pwned{chr(7)}"
    shown = job("failed", reason=f"exit code 3 {evil}", pending_reasons=[f"w1: {evil}busy"])
    conn = mock({"GET jobs/j1": [shown], "GET jobs/j1/events": [contracts.EventList(events=[])]})
    assert cli.main(["job", "j1"], connection=conn) == 0
    out = capsys.readouterr().out
    assert ESC not in out and "\x07" not in out
    assert "reason:    exit code 3 \n" in out and "  w1: busy\n" in out
    ended = job("failed", exit_code=3, started_at=NOW, ended_at=NOW, reason=f"boom{evil}")
    conn = mock({
        "POST jobs": [job()],
        "GET jobs/j1": [job("running")],
        "GET jobs/j1/logs": [log_page(f"{ESC}[1Aup"), log_page()],
        "GET jobs/j1/wait": [ended],
    })  # fmt: skip
    assert cli.main(["submit", "-f", "--", "true"], connection=conn) == 3
    captured = capsys.readouterr()
    assert captured.out == "up\n"
    assert ESC not in captured.err and captured.err.endswith(": boom\n")


# ------------------------------------------------------- join: where its token comes from

REMOTE_HTTP = "http://192.0.2.1:9/"  # another machine, plain HTTP: refused before any request


def test_the_cli_refuses_a_token_in_clear_text_to_another_machine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--url", REMOTE_HTTP, "--token", "gl_t", "jobs"]) == 1
    line = one_error_line(capsys)
    assert "clear text" in line and "--insecure" in line


def test_join_takes_its_token_from_a_file_and_drops_it_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPULAYER_JOIN_TOKEN", "gl_from_env")
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_from_file\n")
    assert cli.main(["join", REMOTE_HTTP, "--token-file", str(token_file)]) == 1
    line = one_error_line(capsys)  # no warning: nothing secret on the command line
    assert "clear text" in line and "--insecure" in line
    assert "GPULAYER_JOIN_TOKEN" not in os.environ  # nothing the worker starts inherits it
    assert cli.main(["join", REMOTE_HTTP, "--token-file", str(tmp_path / "nope")]) == 1
    assert "cannot read the join token from" in one_error_line(capsys)


def test_join_reads_its_token_from_stdin_with_token_file_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """How `gpulayer up` hands the join token to a worker it started early."""
    monkeypatch.delenv("GPULAYER_JOIN_TOKEN", raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("gl_from_stdin\n"))
    args = argparse.Namespace(token_file=Path("-"), token=None)
    assert up.join_token(args) == "gl_from_stdin"
    # The cluster went away first. The token is read last (after the worker's own
    # checks, while its control plane starts): a loopback URL gets that far.
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    argv = ["join", "http://127.0.0.1:9/", "--token-file", "-", "--task-user", ""]
    assert cli.main([*argv, "--data-dir", str(tmp_path / "w")]) == 1
    assert "is empty" in one_error_line(capsys)


def test_join_says_where_a_token_goes_and_warns_about_one_in_argv(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPULAYER_JOIN_TOKEN", raising=False)
    assert cli.main(["join", REMOTE_HTTP]) == 1
    line = one_error_line(capsys)
    assert "GPULAYER_JOIN_TOKEN" in line and "--token-file" in line
    assert cli.main(["join", REMOTE_HTTP, "--token", "gl_t"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "visible to other users" in err[0] and "clear text" in err[1]


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
