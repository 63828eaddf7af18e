"""The CLI people expect: help and examples on every command, ``-o json``, completion,
exit codes, a closed pipe, ``status``; the control plane is a mock transport."""

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpulayer import __version__, cli, client, contracts
from gpulayer.cli.cluster import free_port
from gpulayer.cli.parser import EXIT_CODES

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def gl_no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_CONFIG", str(tmp_path / "connection.json"))
    monkeypatch.setenv("GPULAYER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("GPULAYER_URL", raising=False)
    monkeypatch.delenv("GPULAYER_TOKEN", raising=False)


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (command path, parser) below ``parser``, itself included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))


def test_every_command_has_examples_and_every_option_says_what_it_does() -> None:
    missing = []
    for path, parser in commands(cli.build_parser()):
        if path and "examples:" not in (parser.epilog or ""):
            missing.append(f"gpulayer {' '.join(path)}: no examples")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help is not None:
                continue
            missing.append(f"gpulayer {' '.join(path)} {action.dest}: no help")
    assert missing == []


def test_no_help_text_shows_rst_markup(capsys: pytest.CaptureFixture[str]) -> None:
    for path, _ in commands(cli.build_parser()):
        assert cli.main([*path, "--help"]) == 0
        text = capsys.readouterr().out
        assert "``" not in text and ":mod:" not in text, path


def test_version_and_exit_codes_are_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"gpulayer {__version__}\n"
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    guide = (ROOT / "docs" / "cli.md").read_text()
    for code, meaning in EXIT_CODES.items():
        assert f"  {code:<4} {meaning}" in text
        assert f"| {code} | {meaning} |" in guide  # the CLI reference's table says the same


def test_a_reader_that_leaves_early_is_no_error() -> None:
    """``gpulayer ... | head -2``: exit 0, nothing on stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "submit", "--help"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before gpulayer writes a line
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(30) == 0
    assert err == b""


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_the_shell_code(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", shell]) == 0
    code = capsys.readouterr().out
    assert "gpulayer" in code and "_ARGCOMPLETE" in code


def test_tab_completion_completes_commands_and_options(tmp_path: Path) -> None:
    out = tmp_path / "completions"
    line = "gpulayer jobs --st"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n",
           "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}  # fmt: skip
    subprocess.run([sys.executable, "-m", "gpulayer"], env=env, check=True, timeout=60)
    assert out.read_text().split() == ["--state"]


# ------------------------------------------------------------------------- -o json


def job(state: str = "queued", **kw: object) -> contracts.Job:
    fields: dict[str, object] = {
        "id": "j1", "spec": {"command": ["true"], "name": "train"}, "state": state,
        "owner": "ada", "created_at": NOW, "updated_at": NOW,
    }  # fmt: skip
    return contracts.Job.model_validate({**fields, **kw})


WORKER = contracts.Worker.model_validate({
    "id": "w1", "name": "local-1", "state": "ready", "hostname": "h", "cpus": 4,
    "memory_bytes": 1 << 30, "slots": 4, "registered_at": NOW, "version": "9.9",
})  # fmt: skip
SESSION = contracts.Session(name="s", job_id="j2", state="running", owner="ada",
                            idle_timeout=60, created_at=NOW)  # fmt: skip
PLACEMENT = contracts.Placement(job_id="j1", state="queued", satisfiable=False, summary="never")
ARTIFACT = contracts.Artifact.model_validate(
    {"name": "out.txt", "size": 3, "sha256": "a" * 64, "created_at": NOW}
)
TOKEN = contracts.Token.model_validate(
    {"id": "k1", "name": "ci", "role": "submitter", "state": "active", "created_at": NOW}
)
ROUTES: dict[str, contracts.BaseModel] = {
    "GET jobs": contracts.JobList(jobs=[job()]),
    "GET jobs/j1": job(),
    "POST jobs": job(),
    "POST jobs/j1/cancel": job("cancelled"),
    "GET jobs/j1/placement": PLACEMENT,
    "GET jobs/j1/artifacts": contracts.ArtifactList(artifacts=[ARTIFACT]),
    "GET workers": contracts.WorkerList(workers=[WORKER]),
    "GET sessions": contracts.SessionList(sessions=[SESSION]),
    "GET tokens": contracts.TokenList(tokens=[TOKEN]),
    "GET health": contracts.Health(version="9.9", workers_ready=1, jobs_active=1),
}


def mock() -> client.Connection:
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/gpulayer/api/v1/")
        model = ROUTES[f"{request.method} {path}"]
        status = 201 if request.method == "POST" and path == "jobs" else 200
        return httpx.Response(status, content=model.model_dump_json().encode())

    return client.Connection("http://cp/", "gl_t", transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("argv", "model", "code"),
    [
        (["jobs"], contracts.JobList, 0),
        (["job", "j1"], contracts.Job, 0),
        (["submit", "--", "true"], contracts.Job, 0),
        (["cancel", "j1"], contracts.Job, 0),
        (["explain", "j1"], contracts.Placement, 1),
        (["artifacts", "j1"], contracts.ArtifactList, 0),
        (["workers"], contracts.WorkerList, 0),
        (["sessions"], contracts.SessionList, 0),
        (["token", "list"], contracts.TokenList, 0),
    ],
)
def test_json_output_is_the_contract_model(
    argv: list[str], model: type[contracts.BaseModel], code: int,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    at = argv.index("--") if "--" in argv else len(argv)  # options before the command
    assert cli.main([*argv[:at], "-o", "json", *argv[at:]], connection=mock()) == code
    out = capsys.readouterr().out
    parsed = model.model_validate_json(out)
    assert parsed.model_dump(mode="json") == json.loads(out)


def test_json_escapes_what_a_terminal_would_act_on(capsys: pytest.CaptureFixture[str]) -> None:
    evil = job(reason="\x1b]0;pwned\x07 \x9b2J ×")
    ROUTES["GET jobs/j1"] = evil
    try:
        assert cli.main(["job", "j1", "-o", "json"], connection=mock()) == 0
    finally:
        ROUTES["GET jobs/j1"] = job()
    out = capsys.readouterr().out
    assert out.isascii() and "\x1b" not in out and "\x07" not in out
    assert contracts.Job.model_validate_json(out).reason == evil.reason


def test_status_says_what_is_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status"], connection=mock()) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gpulayer 9.9 is up at http://cp/"
    assert out[1] == "workers: 1 of 1 ready"
    assert out[3].split() == ["local-1", "ready", "0/4", "-"]
    assert out[-1] == "jobs: 1 queued, 1 scheduled, 1 running"
    assert cli.main(["status", "-o", "json"], connection=mock()) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["up"] is True and doc["health"]["version"] == "9.9"
    assert doc["workers"][0]["name"] == "local-1"


def test_status_of_a_control_plane_that_is_down_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    assert cli.main(["status", "--url", url, "--token", "gl_t"]) == 1
    assert capsys.readouterr().err.startswith("gpulayer: error: cannot reach")
    assert cli.main(["status", "--url", url, "--token", "gl_t", "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["up"] is False and doc["url"] == url and "cannot reach" in doc["error"]


def test_down_without_an_up_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["down"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpulayer: error: no `gpulayer up` is running for ")


def test_durations_as_gpulayer_prints_them_are_accepted() -> None:
    sent: list[contracts.JobSpec] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(contracts.JobSpec.model_validate_json(request.content))
        return httpx.Response(201, content=job().model_dump_json().encode())

    conn = client.Connection("http://cp/", "gl_t", transport=httpx.MockTransport(handle))
    argv = ["submit", "--timeout", "1h30m", "--queue-timeout", "4m05s", "--", "true"]
    assert cli.main(argv, connection=conn) == 0
    assert (sent[0].timeout, sent[0].queue_timeout) == (5400, 245)


def test_job_names_every_node_of_a_distributed_job(capsys: pytest.CaptureFixture[str]) -> None:
    tasks = [
        {"id": f"t{n}", "job_id": "j1", "attempt": 1, "state": "succeeded", "node_rank": n,
         "worker_name": f"local-{n + 1}", "created_at": NOW}
        for n in (1, 0)
    ]  # fmt: skip
    gang = job("succeeded", attempts=1, worker_name="local-1", tasks=tasks)
    ROUTES["GET jobs/j1"] = gang
    ROUTES["GET jobs/j1/events"] = contracts.EventList(events=[])
    try:
        assert cli.main(["job", "j1"], connection=mock()) == 0
    finally:
        ROUTES["GET jobs/j1"] = job()
    assert "worker:    local-1 (node 0), local-2 (node 1)\n" in capsys.readouterr().out


def test_only_the_one_table_printer_pads_columns() -> None:
    """Every text table goes through ``gpulayer.cli.output.table`` (one look, one
    place that strips terminal control from cells)."""
    padders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "gpulayer").rglob("*.py")
        if path.name != "output.py"
        and (".ljust(" in path.read_text() or ".rjust(" in path.read_text())
    ]
    assert padders == []
