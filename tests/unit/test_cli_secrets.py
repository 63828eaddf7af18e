"""``gpulayer secret ...`` and ``--secret``: a value never comes from the command line."""

import io
import json
from datetime import UTC, datetime

import httpx
import pytest

from gpulayer import cli, client, contracts

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
VALUE = "hf_Zq8w3LxT9vRk2Pn7Ys4Mb6"


def recording(
    seen: list[tuple[str, str, bytes]] | None = None,
) -> tuple[client.Connection, list[tuple[str, str, bytes]]]:
    """A connection whose requests land in ``seen``, answered as the server would."""
    seen = [] if seen is None else seen

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path.rsplit("/api/v1/", 1)[1]
        seen.append((request.method, path, request.content))
        if request.method == "DELETE":
            return httpx.Response(204)
        if path == "secrets":
            listed = contracts.SecretList(secrets=[secret("HF_TOKEN", ["bob"])])
            return httpx.Response(200, content=listed.model_dump_json().encode())
        if path == "jobs":
            spec = json.loads(request.content)
            job = contracts.Job(id="j1", spec=spec, state="queued", owner="ada",
                                created_at=NOW, updated_at=NOW)  # fmt: skip
            return httpx.Response(201, content=job.model_dump_json().encode())
        status = 200 if "/shares/" in path else 201
        return httpx.Response(status, content=secret(path.split("/")[1]).model_dump_json().encode())

    conn = client.Connection("http://x/", "gl_t", transport=httpx.MockTransport(handler))
    return conn, seen


def secret(name: str, shared: list[str] | None = None) -> contracts.Secret:
    return contracts.Secret(name=name, owner="ada", created_at=NOW, updated_at=NOW,
                            shared_with=shared or [])  # fmt: skip


def test_a_value_on_the_command_line_is_refused_and_never_sent(capsys):
    conn, seen = recording()
    assert cli.main(["secret", "set", "HF_TOKEN", VALUE], connection=conn) == 2
    err = capsys.readouterr().err
    assert "takes no value on the command line" in err and VALUE not in err
    assert seen == []


@pytest.mark.parametrize("piped", [VALUE + "\n", VALUE])
def test_set_reads_stdin_and_drops_one_trailing_newline(monkeypatch, capsys, piped):
    conn, seen = recording()
    monkeypatch.setattr("sys.stdin", io.StringIO(piped))
    assert cli.main(["secret", "set", "HF_TOKEN"], connection=conn) == 0
    assert seen == [("PUT", "secrets/HF_TOKEN", json.dumps({"value": VALUE}).encode()
                     .replace(b" ", b""))]  # fmt: skip
    out = capsys.readouterr()
    assert out.out == "secret HF_TOKEN set for ada\n" and VALUE not in out.out + out.err


def test_set_from_a_file_keeps_inner_newlines(tmp_path, capsys):
    conn, seen = recording()
    pem = "-----BEGIN KEY-----\nQUJDREVGR0g=\n-----END KEY-----\n"
    (tmp_path / "key.pem").write_text(pem)
    args = ["secret", "set", "KEY", "--from-file", str(tmp_path / "key.pem")]
    assert cli.main(args, connection=conn) == 0
    assert json.loads(seen[0][2]) == {"value": pem.removesuffix("\n")}


def test_a_terminal_gets_a_prompt_without_echo(monkeypatch, capsys):
    conn, seen = recording()

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    asked = []
    monkeypatch.setattr("sys.stdin", Tty(""))
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or VALUE)
    assert cli.main(["secret", "set", "HF_TOKEN"], connection=conn) == 0
    assert asked == ["value of HF_TOKEN (not echoed): "]
    assert json.loads(seen[0][2]) == {"value": VALUE}


def test_empty_or_short_values_fail_in_one_line_without_echo(monkeypatch, capsys):
    conn, seen = recording()
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["secret", "set", "HF_TOKEN"], connection=conn) == 2
    assert "stdin was empty" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("ab1\n"))
    assert cli.main(["secret", "set", "HF_TOKEN"], connection=conn) != 0
    err = capsys.readouterr().err
    assert "at least 4 characters" in err and "ab1" not in err and len(err.splitlines()) == 1
    assert seen == []


def test_list_delete_share_and_submit_with_secrets(capsys):
    seen: list[tuple[str, str, bytes]] = []

    def run(*argv: str) -> int:
        return cli.main(list(argv), connection=recording(seen)[0])

    assert run("secret", "list") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["NAME", "OWNER", "SHARED", "WITH"]
    assert out[1].split()[:3] == ["HF_TOKEN", "ada", "bob"]
    assert run("secret", "delete", "HF_TOKEN", "--owner", "bob") == 0
    assert run("secret", "share", "HF_TOKEN", "--with", "bob") == 0
    assert run("secret", "unshare", "HF_TOKEN", "--with", "bob") == 0
    assert run("submit", "--secret", "HF_TOKEN", "--secret", "WANDB_KEY", "--", "x") == 0
    assert [(m, p) for m, p, _ in seen] == [
        ("GET", "secrets"), ("DELETE", "secrets/HF_TOKEN"),
        ("PUT", "secrets/HF_TOKEN/shares/bob"), ("DELETE", "secrets/HF_TOKEN/shares/bob"),
        ("POST", "jobs"),
    ]  # fmt: skip
    assert json.loads(seen[-1][2])["secrets"] == ["HF_TOKEN", "WANDB_KEY"]
