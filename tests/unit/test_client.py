"""The sync client against canned answers (httpx.MockTransport), and config resolution."""

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpulayer import client, contracts, errors
from gpulayer.client import config

URL = "http://lab.example:8888/a%40b/"
API = "http://lab.example:8888/a%40b/gpulayer/api/v1/"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

Handler = Callable[[httpx.Request], httpx.Response]


def job_model(state: str = "queued", **kw: object) -> contracts.Job:
    spec = contracts.JobSpec(command=["true"])
    fields: dict[str, object] = {
        "id": "j1",
        "spec": spec,
        "state": state,
        "owner": "admin",
        "created_at": NOW,
        "updated_at": NOW,
    }
    fields.update(kw)
    return contracts.Job.model_validate(fields)


def answer(model: contracts.BaseModel, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=model.model_dump_json().encode())


def line(offset: int, text: str) -> contracts.LogLine:
    return contracts.LogLine(offset=offset, stream="stdout", ts=NOW, text=text)


class Recorder:
    """A MockTransport handler that records requests and replays canned answers."""

    def __init__(self, *answers: httpx.Response | Handler) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        nxt = self.answers.pop(0)
        return nxt(request) if callable(nxt) else nxt

    def connection(self) -> client.Connection:
        return client.Connection(URL, "gl_secret", transport=httpx.MockTransport(self))


# ------------------------------------------------------------------ plumbing


def test_paths_join_onto_a_percent_encoded_base_url_and_carry_the_bearer_token() -> None:
    rec = Recorder(answer(contracts.Health(version="1")), answer(contracts.JobList(jobs=[])))
    with rec.connection() as conn:
        assert conn.health().version == "1"
        assert conn.jobs(state="running", limit=5) == []
    first, second = rec.requests
    assert str(first.url) == API + "health"
    assert first.url.raw_path == b"/a%40b/gpulayer/api/v1/health"
    assert first.headers["Authorization"] == "Bearer gl_secret"
    assert second.url.path.endswith("/jobs")
    assert dict(second.url.params) == {"limit": "5", "state": "running"}


@pytest.mark.parametrize(
    ("status", "code", "field", "cls"),
    [
        (400, "invalid", "resources.gpus", errors.ValidationError),
        (401, "unauthenticated", None, errors.AuthError),
        (403, "forbidden", None, errors.Forbidden),
        (404, "not_found", None, errors.NotFound),
        (409, "invalid_transition", None, errors.InvalidTransition),
        (413, "too_large", None, errors.PayloadTooLarge),
    ],
)
def test_error_bodies_map_to_their_exception_class(
    status: int, code: str, field: str | None, cls: type[errors.GpulayerError]
) -> None:
    body = contracts.ErrorBody(code=code, message="it went wrong", field=field)
    with Recorder(answer(body, status)).connection() as conn, pytest.raises(cls) as info:
        conn.job("j1")
    assert type(info.value) is cls
    assert info.value.message == "it went wrong"
    assert info.value.field == field


def test_an_unknown_code_or_a_non_json_answer_is_an_api_error_with_context() -> None:
    odd = contracts.ErrorBody(code="internal", message="internal error; see the server log")
    rec = Recorder(answer(odd, 500), httpx.Response(502, text="<html>bad gateway</html>"))
    with rec.connection() as conn:
        with pytest.raises(errors.ApiError) as info:
            conn.workers()
        assert (info.value.status, info.value.method) == (500, "GET")
        assert info.value.url == API + "workers"
        assert info.value.message == "internal error; see the server log"
        with pytest.raises(errors.ApiError, match="502") as info:
            conn.workers()
        assert info.value.status == 502


def test_a_transport_failure_is_connection_failed() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with Recorder(refuse).connection() as conn, pytest.raises(errors.ConnectionFailed) as info:
        conn.health()
    assert "cannot reach the gpulayer control plane at " + URL in info.value.message
    assert "connection refused" in info.value.message


def test_a_non_http_url_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError):
        client.Connection("lab.example:8888", "gl_x")


# ------------------------------------------------------------------- routes


def test_wait_long_polls_through_204s_until_the_job_ended() -> None:
    done = job_model("succeeded", exit_code=0)
    rec = Recorder(httpx.Response(204), httpx.Response(204), answer(done))
    with rec.connection() as conn:
        assert conn.wait("j1").state == "succeeded"
    assert len(rec.requests) == 3
    for req in rec.requests:
        assert req.url.path.endswith("/jobs/j1/wait")
        assert float(req.url.params["timeout"]) <= client.LONG_POLL_SECONDS


def test_wait_with_a_deadline_raises_timeout_error() -> None:
    def route(request: httpx.Request) -> httpx.Response:
        rec.answers.append(route)  # answer every request the same way
        if request.url.path.endswith("/wait"):
            return httpx.Response(204)
        return answer(job_model("running"))

    rec = Recorder(route)
    with rec.connection() as conn, pytest.raises(TimeoutError, match="j1 did not end"):
        conn.wait("j1", timeout=0.05)
    assert rec.requests[-1].url.path.endswith("/jobs/j1")
    assert all(float(r.url.params["timeout"]) <= 0.05 for r in rec.requests[:-1])


def test_follow_logs_yields_each_line_once_across_pages_until_complete() -> None:
    pages = [
        contracts.LogPage(lines=[line(0, "a"), line(1, "b")], next_offset=2, complete=False),
        httpx.Response(204),  # a hold that ran out
        # An overlapping page (a retried request): line 1 must not come twice.
        contracts.LogPage(lines=[line(1, "b"), line(2, "c")], next_offset=3, complete=True),
        contracts.LogPage(lines=[], next_offset=3, complete=True),
    ]
    rec = Recorder(*(p if isinstance(p, httpx.Response) else answer(p) for p in pages))
    with rec.connection() as conn:
        assert [ln.text for ln in conn.follow_logs("j1")] == ["a", "b", "c"]
    offsets = [int(r.url.params["offset"]) for r in rec.requests]
    assert offsets == [0, 2, 2, 3]
    assert rec.requests[0].url.params["wait"] == "30.0"


PNG_SHA = hashlib.sha256(b"png").hexdigest()


def test_download_writes_artifacts_below_dest_and_refuses_escapes(tmp_path: Path) -> None:
    arts = contracts.ArtifactList(
        artifacts=[
            contracts.Artifact(name="plots/loss.png", sha256=PNG_SHA, size=3, created_at=NOW),
            contracts.Artifact(name="../evil", sha256="1" * 64, size=1, created_at=NOW),
        ]
    )
    rec = Recorder(answer(arts), httpx.Response(200, content=b"png"), answer(arts))
    with rec.connection() as conn:
        assert conn.download("j1", tmp_path, names=["plots/loss.png"]) == [
            tmp_path / "plots" / "loss.png"
        ]
        assert (tmp_path / "plots" / "loss.png").read_bytes() == b"png"
        with pytest.raises(errors.ValidationError, match="outside"):
            conn.download("j1", tmp_path / "dl")
    assert rec.requests[1].url.raw_path.endswith(b"/jobs/j1/artifacts/plots/loss.png")
    assert not (tmp_path / "evil").exists()


# ------------------------------------------------------------ module level


def submitted(rec: Recorder) -> contracts.JobSpec:
    return contracts.JobSpec.model_validate_json(rec.requests[-1].content)


def test_submit_a_string_runs_a_shell_and_a_list_runs_an_argv() -> None:
    rec = Recorder(answer(job_model(), 201), answer(job_model(), 201))
    conn = rec.connection()
    job = client.submit("echo hi | wc -c", gpus=1, timeout="10m", connection=conn)
    assert isinstance(job, client.Job)
    assert job.id == "j1"
    assert job.state == "queued"
    spec = submitted(rec)
    assert (spec.shell, spec.command) == ("echo hi | wc -c", None)
    assert (spec.resources.gpus, spec.timeout) == (1, 600.0)
    client.submit(["python", "-c", "print(1)"], env={"A": "1"}, connection=conn)
    spec = submitted(rec)
    assert (spec.command, spec.shell, spec.env) == (["python", "-c", "print(1)"], None, {"A": "1"})
    assert rec.requests[-1].headers["Content-Type"] == "application/json"


def test_submit_with_a_workdir_uploads_the_bundle_first(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")

    def store(request: httpx.Request) -> httpx.Response:
        body = request.read()
        ref = contracts.BlobRef(sha256=hashlib.sha256(body).hexdigest(), size=len(body))
        return answer(ref, 201)

    rec = Recorder(store, answer(job_model(), 201))
    client.submit(["python", "train.py"], workdir=tmp_path, connection=rec.connection())
    upload, post = rec.requests
    assert upload.url.path.endswith("/blobs")
    assert upload.content[:2] == b"\x1f\x8b"  # gzip
    sha = hashlib.sha256(upload.content).hexdigest()
    assert upload.headers["X-Gpulayer-Sha256"] == sha
    assert upload.headers["Content-Length"] == str(len(upload.content))
    assert contracts.JobSpec.model_validate_json(post.content).bundle == sha


def test_a_bad_option_is_a_validation_error_naming_the_field_before_any_request() -> None:
    rec = Recorder()
    with pytest.raises(errors.ValidationError) as info:
        client.submit(["true"], gpus=-1, connection=rec.connection())
    assert info.value.field == "resources.gpus"
    assert "resources.gpus" in info.value.message
    with pytest.raises(errors.ValidationError, match="duration"):
        client.submit(["true"], timeout="soon", connection=rec.connection())
    assert rec.requests == []


def test_job_handle_waits_raises_on_failure_and_reprs() -> None:
    failed = job_model("failed", exit_code=3, reason="exit code 3", worker_name="box1")
    rec = Recorder(answer(job_model(), 201), answer(failed))
    job = client.submit(["false"], connection=rec.connection())
    with pytest.raises(errors.JobFailed) as info:
        job.wait(raise_on_failure=True)
    assert (info.value.state, info.value.exit_code, info.value.worker) == ("failed", 3, "box1")
    assert repr(job) == "<Job j1 failed exit=3 worker=box1>"


def test_job_logs_reads_every_page() -> None:
    pages = [
        contracts.LogPage(lines=[line(0, "a"), line(1, "b")], next_offset=2, complete=False),
        contracts.LogPage(lines=[line(2, "c")], next_offset=3, complete=True),
        contracts.LogPage(lines=[], next_offset=3, complete=True),
    ]
    rec = Recorder(*(answer(p) for p in pages))
    job = client.Job(rec.connection(), job_model("succeeded"))
    assert job.logs() == ["a", "b", "c"]


# ------------------------------------------------------------------- config


@pytest.fixture
def gl_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cfg" / "connection.json"
    monkeypatch.setenv("GPULAYER_CONFIG", str(path))
    monkeypatch.delenv("GPULAYER_URL", raising=False)
    monkeypatch.delenv("GPULAYER_TOKEN", raising=False)
    return path


def test_config_resolution_order_is_args_then_env_then_file(
    gl_config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = config.save(config.ConnectionConfig(url="http://file/", token="gl_file"))
    assert saved == gl_config_file
    assert gl_config_file.stat().st_mode & 0o777 == 0o600
    assert json.loads(gl_config_file.read_text())["url"] == "http://file/"
    assert config.resolve() == config.ConnectionConfig(url="http://file/", token="gl_file")
    monkeypatch.setenv("GPULAYER_URL", "http://env/")
    monkeypatch.setenv("GPULAYER_TOKEN", "gl_env")
    assert config.resolve() == config.ConnectionConfig(url="http://env/", token="gl_env")
    assert config.resolve("http://arg/", "gl_arg") == config.ConnectionConfig(
        url="http://arg/", token="gl_arg"
    )


def test_the_file_token_is_not_sent_to_another_url(gl_config_file: Path) -> None:
    config.save(config.ConnectionConfig(url="http://file/", token="gl_file"))
    assert config.resolve("http://file").token == "gl_file"
    with pytest.raises(errors.ConfigError, match="no gpulayer token for http://other/"):
        config.resolve("http://other/")


def test_nothing_configured_says_how_to_fix_it(gl_config_file: Path) -> None:
    with pytest.raises(errors.ConfigError) as info:
        config.resolve()
    assert "gpulayer up" in info.value.message
    assert "GPULAYER_URL" in info.value.message
    assert "gl.connect(url, token)" in info.value.message


# ---------------------------------------------------- tokens never in clear text


@pytest.mark.parametrize(
    "url", ["http://10.0.0.7:8765/", "http://gpu-lab.example:8765/", "http://[fd00::1]:8765/"]
)
def test_a_token_is_not_sent_in_clear_text_to_another_machine(url: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        client.Connection(url, "gl_x")
    msg = info.value.message
    assert "clear text" in msg and "https://" in msg and "insecure=True" in msg
    client.Connection(url, "gl_x", insecure=True).close()  # the user's own choice


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8765/", "http://localhost:8765/", "http://[::1]:8765/",
            "https://gpu-lab.example:8765/"],
)  # fmt: skip
def test_loopback_and_https_need_no_opt_in(url: str) -> None:
    client.Connection(url, "gl_x").close()


def test_the_clear_text_opt_in_comes_from_the_environment_or_the_saved_file(
    gl_config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPULAYER_INSECURE", raising=False)
    assert not config.resolve("http://10.0.0.7/", "gl_x").insecure
    with pytest.raises(errors.ConfigError, match="clear text"):
        client.connect("http://10.0.0.7:9/", "gl_x")
    monkeypatch.setenv("GPULAYER_INSECURE", "1")
    assert config.resolve("http://10.0.0.7/", "gl_x").insecure
    monkeypatch.delenv("GPULAYER_INSECURE")
    config.save(config.ConnectionConfig(url="http://10.0.0.7/", token="gl_f", insecure=True))
    assert config.resolve().insecure
    assert not config.resolve("http://10.0.0.8/", "gl_x").insecure  # only for that URL


# ------------------------------------------------- outages: retries, idempotency keys


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def dropped(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("server disconnected", request=request)


def gateway(status: int) -> httpx.Response:
    return httpx.Response(status, json={"code": "error", "message": "starting"})


def test_a_submit_is_retried_through_an_outage_with_one_idempotency_key() -> None:
    rec = Recorder(
        answer(contracts.Health(version="1")),
        dropped,  # stored or not: the client cannot know
        refused,
        gateway(503),
        answer(job_model(), 200),  # the control plane had stored it: the same job
    )
    with client.Connection(
        URL, "t", transport=httpx.MockTransport(rec), reconnect_seconds=30
    ) as conn:
        conn.health()
        assert conn.submit(contracts.JobSpec(command=["true"])).id == "j1"
    keys = {r.headers["Idempotency-Key"] for r in rec.requests[1:]}
    assert len(rec.requests) == 5 and len(keys) == 1
    assert keys.pop().startswith("gl-")
    assert all(r.content == rec.requests[1].content for r in rec.requests[1:])


def test_each_logical_submit_gets_its_own_key_and_a_given_key_is_sent() -> None:
    rec = Recorder(answer(job_model(), 201), answer(job_model(), 201),
                   answer(contracts.JobList(jobs=[]), 201))  # fmt: skip
    with rec.connection() as conn:
        conn.submit(contracts.JobSpec(command=["true"]))
        conn.submit(contracts.JobSpec(command=["true"]), idempotency_key="mine")
        conn.submit_many([contracts.JobSpec(command=["true"])])
    first, second, third = (r.headers["Idempotency-Key"] for r in rec.requests)
    assert second == "mine" and len({first, second, third}) == 3


def test_a_connection_that_never_reached_its_control_plane_fails_at_once() -> None:
    rec = Recorder(refused)
    with (
        client.Connection(
            URL, "t", transport=httpx.MockTransport(rec), reconnect_seconds=30
        ) as conn,
        pytest.raises(errors.ConnectionFailed, match="cannot reach"),
    ):
        conn.submit(contracts.JobSpec(command=["true"]))
    assert len(rec.requests) == 1


def test_waits_retry_but_plain_reads_and_client_errors_do_not() -> None:
    rec = Recorder(
        answer(contracts.Health(version="1")),
        refused,
        gateway(502),
        answer(job_model("succeeded")),  # the wait, after the outage
        refused,  # a plain read: raised at once
        httpx.Response(400, json={"code": "invalid", "message": "bad", "field": "x"}),
    )
    with client.Connection(
        URL, "t", transport=httpx.MockTransport(rec), reconnect_seconds=30
    ) as conn:
        conn.health()
        assert conn.wait("j1").state == "succeeded"
        with pytest.raises(errors.ConnectionFailed):
            conn.job("j1")
        with pytest.raises(errors.ValidationError):
            conn.wait("j1")
    assert len(rec.requests) == 6


def test_an_outage_longer_than_reconnect_seconds_raises_saying_so() -> None:
    rec = Recorder(answer(contracts.Health(version="1")), *[refused] * 100)
    with client.Connection(
        URL, "t", transport=httpx.MockTransport(rec), reconnect_seconds=0.5
    ) as conn:
        conn.health()
        with pytest.raises(errors.ConnectionFailed, match=r"still failing after \d+s"):
            conn.wait("j1")
    assert 2 < len(rec.requests) < 20  # backoff, not a busy loop


def test_follow_logs_resumes_from_its_offset_after_an_outage() -> None:
    page1 = contracts.LogPage(lines=[line(0, "a"), line(1, "b")], next_offset=2, complete=False)
    page2 = contracts.LogPage(lines=[line(2, "c")], next_offset=3, complete=True)
    done = contracts.LogPage(lines=[], next_offset=3, complete=True)
    rec = Recorder(answer(page1), dropped, refused, answer(page2), answer(done))
    with client.Connection(
        URL, "t", transport=httpx.MockTransport(rec), reconnect_seconds=30
    ) as conn:
        assert [ln.text for ln in conn.follow_logs("j1")] == ["a", "b", "c"]
    offsets = [r.url.params["offset"] for r in rec.requests]
    assert offsets == ["0", "2", "2", "2", "3"]


def test_reconnect_seconds_comes_from_the_argument_or_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("GPULAYER_RECONNECT_SECONDS", raising=False)
    assert client.Connection(URL, "t", insecure=True).reconnect_seconds == 120
    monkeypatch.setenv("GPULAYER_RECONNECT_SECONDS", "7.5")
    assert client.Connection(URL, "t", insecure=True).reconnect_seconds == 7.5
    assert client.Connection(URL, "t", insecure=True, reconnect_seconds=0).reconnect_seconds == 0
    monkeypatch.setenv("GPULAYER_RECONNECT_SECONDS", "soon")
    with pytest.raises(errors.ConfigError, match="GPULAYER_RECONNECT_SECONDS='soon'"):
        client.Connection(URL, "t", insecure=True)
    with pytest.raises(errors.ConfigError, match="reconnect_seconds must be"):
        client.Connection(URL, "t", insecure=True, reconnect_seconds=-1)


def test_an_empty_gpulayer_token_is_an_error_not_the_saved_admin_token(
    monkeypatch, tmp_path
) -> None:
    saved = tmp_path / "connection.json"
    config.save(config.ConnectionConfig(url=URL, token="gl_admin"), saved)
    monkeypatch.setenv("GPULAYER_CONFIG", str(saved))
    monkeypatch.setenv("GPULAYER_URL", URL)
    monkeypatch.setenv("GPULAYER_TOKEN", "")
    with pytest.raises(errors.ConfigError, match="GPULAYER_TOKEN is set but empty"):
        config.resolve()
    assert config.resolve(token="gl_given").token == "gl_given"  # an explicit one still wins
    monkeypatch.delenv("GPULAYER_TOKEN")
    assert config.resolve().token == "gl_admin"


@pytest.mark.parametrize("command", [123, None, b"echo hi", 1.5])
def test_submit_of_something_not_a_command_says_what_it_takes(command: object) -> None:
    rec = Recorder()
    with pytest.raises(TypeError, match=r"a string .* or a list of\s+strings") as e:
        client.submit(command, connection=rec.connection())  # type: ignore[arg-type]
    assert type(command).__name__ in str(e.value)
    assert rec.requests == []  # nothing was sent


def test_the_channel_mode_comes_from_the_argument_or_gpulayer_channel(monkeypatch):
    from gpulayer.client.connection import channel_mode

    monkeypatch.delenv("GPULAYER_CHANNEL", raising=False)
    assert channel_mode() == "auto"
    monkeypatch.setenv("GPULAYER_CHANNEL", "HTTP")
    assert channel_mode() == "http"
    assert channel_mode("auto") == "auto"  # the argument wins
    monkeypatch.setenv("GPULAYER_CHANNEL", "carrier-pigeon")
    with pytest.raises(errors.ConfigError, match="GPULAYER_CHANNEL must be one of auto, http"):
        channel_mode()
    with pytest.raises(errors.ConfigError, match="channel must be one of"):
        client.Connection("http://127.0.0.1:1/", "gl_x", channel="ws")


def test_a_channel_answer_reads_as_its_http_response_and_names_its_request():
    from gpulayer.client.connection import _ChannelResponse

    answer = contracts.ChannelAnswer(id=3, status=201, body='{"id": "j1"}')
    url = "http://127.0.0.1:9/gpulayer/api/v1/jobs"
    resp = _ChannelResponse(answer, "POST", url, {"wait": 0.5})
    assert (resp.status_code, resp.json(), resp.text) == (201, {"id": "j1"}, '{"id": "j1"}')
    assert (resp.is_success, resp.reason_phrase) == (True, "Created")
    assert resp.headers["content-type"] == "application/json"
    assert resp.request.method == "POST"
    assert str(resp.request.url) == url + "?wait=0.5"  # what an error message names
    empty = _ChannelResponse(contracts.ChannelAnswer(id=4, status=204, body=""), "GET", url, None)
    assert (empty.status_code, empty.content, empty.is_success) == (204, b"", True)
    assert "content-type" not in empty.headers
    refused = _ChannelResponse(
        contracts.ChannelAnswer(id=5, status=409, body="{}"), "GET", url, None
    )
    assert (refused.is_success, refused.reason_phrase) == (False, "Conflict")


def test_a_job_answer_reads_as_its_end_without_its_spec():
    """``.run`` reads its submit's answer as a ``JobEnd``: how the job ended and its
    result, the same values the whole ``Job`` holds; the spec and tasks are skipped."""
    spec = contracts.JobSpec(
        kind="function", function={"format": 1, "python": "3.11", "payload": b"p"}
    )
    job = contracts.Job(
        id="j1", spec=spec, state="failed", reason="boom", owner="ada", exit_code=3,
        worker_name="w1", created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:01Z",
        result=b"\x00outcomes", result_size=9, log_lines=2,
    )  # fmt: skip
    end = contracts.JobEnd.model_validate_json(job.model_dump_json())
    for field in contracts.JobEnd.model_fields:
        assert getattr(end, field) == getattr(job, field), field
    assert end.state.terminal
