"""``%%gpulayer`` and ``%gpulayer`` in IPython's test shell, against a control plane
played by ``httpx.MockTransport``: option parsing, the job that is sent, how relayed
messages render, remote errors, push/pull and the session calls."""

import json
import re
from datetime import UTC, datetime

import httpx
import pytest
from IPython.core.displaypub import CapturingDisplayPublisher
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from gpulayer import client, contracts, errors, variables
from gpulayer.client import cells
from gpulayer.client.default import set_default

URL = "http://lab.example:8888/"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PNG = "iVBORw0KGgo="


def msg(msg_type: str, **content) -> str:
    return contracts.KernelMessage(msg_type=msg_type, content=content).model_dump_json()


class FakePlane:
    """Answers the routes a cell uses; ``messages`` are the relayed lines of every cell."""

    def __init__(self, messages: list[str], *, state="succeeded", result: bytes | None = None):
        self.messages = messages
        self.state = state
        self.result = result
        self.requests: list[httpx.Request] = []
        self.sessions: dict[str, contracts.Session] = {}
        self.submitted: list[contracts.JobSpec] = []

    def job(self, spec: contracts.JobSpec, state: str) -> contracts.Job:
        return contracts.Job(
            id="j1", spec=spec, state=state, owner="ada", created_at=NOW, updated_at=NOW,
            worker_name="gpu-box-1", result=self.result,
        )  # fmt: skip

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path.split("/api/v1/", 1)[1]
        verb = request.method
        if verb == "POST" and path == "jobs":
            spec = contracts.JobSpec.model_validate_json(request.content)
            self.submitted.append(spec)
            return self.answer(self.job(spec, "scheduled"), 201)
        if verb == "GET" and re.fullmatch(r"jobs/j1/logs", path):
            offset = int(request.url.params["offset"])
            lines = [contracts.LogLine(offset=i, stream="iopub", ts=NOW, text=t)
                     for i, t in enumerate(self.messages)][offset:]  # fmt: skip
            page = contracts.LogPage(lines=lines, next_offset=len(self.messages), complete=True)
            return self.answer(page)
        if verb == "GET" and path in ("jobs/j1/wait", "jobs/j1"):
            return self.answer(self.job(self.submitted[-1], self.state))
        if verb == "GET" and path.startswith("sessions/"):
            name = path.split("/", 1)[1]
            if name not in self.sessions:
                return httpx.Response(404, json={"code": "not_found", "message": "no session"})
            return self.answer(self.sessions[name])
        if verb == "POST" and path == "sessions":
            req = contracts.CreateSession.model_validate_json(request.content)
            s = contracts.Session(
                name=req.name, job_id="s1", state="queued", owner="ada",
                idle_timeout=req.idle_timeout or 3600, created_at=NOW,
            )  # fmt: skip
            self.sessions[req.name] = s
            return self.answer(s, 201)
        if verb == "DELETE" and path.startswith("sessions/"):
            return httpx.Response(204)
        if verb == "GET" and path == "sessions":
            return self.answer(contracts.SessionList(sessions=list(self.sessions.values())))
        raise AssertionError(f"unexpected {verb} {path}")

    @staticmethod
    def answer(model, status: int = 200) -> httpx.Response:
        return httpx.Response(status, content=model.model_dump_json().encode())


@pytest.fixture
def ip():
    globalipapp.start_ipython()  # once per process; later calls are no-ops
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "gpulayer")
    saved = shell.display_pub
    shell.display_pub = CapturingDisplayPublisher()
    yield shell
    shell.display_pub = saved


@pytest.fixture
def plane():
    made: list[FakePlane] = []
    previous = client.default_connection()

    def make(*messages: str, **kw) -> FakePlane:
        fake = FakePlane(list(messages), **kw)
        conn = client.Connection(URL, "gl_x", transport=httpx.MockTransport(fake))
        set_default(conn)
        made.append(fake)
        return fake

    yield make
    set_default(previous)


def test_output_streams_in_order_and_rich_output_renders(ip, plane, capsys):
    fake = plane(
        msg("stream", name="stdout", text="one\n"),
        msg("stream", name="stderr", text="careful\n"),
        msg("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}, metadata={}),
        msg("stream", name="stdout", text="two\n"),
        msg("execute_result", data={"text/plain": "42"}, metadata={}, execution_count=1),
        msg("execute_reply", status="ok", execution_count=1),
    )
    result = ip.run_cell_magic("gpulayer", "--gpus 1 --gpu-memory 24GiB --timeout 10m", "6 * 7")
    out = capsys.readouterr()
    assert out.out == "one\ntwo\n" and out.err == "careful\n"
    (shown,) = ip.display_pub.outputs
    assert shown["data"] == {"image/png": PNG, "text/plain": "<Figure>"}
    assert repr(result) == "42" and result._repr_mimebundle_() == ({"text/plain": "42"}, {})
    (spec,) = fake.submitted
    assert spec.kind == "cell" and spec.cell.source == "6 * 7" and spec.timeout == 600
    assert spec.resources.gpus == 1 and spec.resources.gpu_memory == 24 * 2**30


def test_a_remote_exception_shows_the_remote_traceback(ip, plane):
    plane(
        msg("error", ename="ZeroDivisionError", evalue="division by zero",
            traceback=["Traceback", "----> 1 1/0", "ZeroDivisionError: division by zero"]),
        msg("execute_reply", status="error", ename="ZeroDivisionError"),
        state="failed",
    )  # fmt: skip
    with pytest.raises(errors.RemoteError) as info:
        ip.run_cell_magic("gpulayer", "", "1/0")
    lines = info.value._render_traceback_()
    assert lines[:3] == ["Traceback", "----> 1 1/0", "ZeroDivisionError: division by zero"]
    assert lines[-1] == "(raised in job j1 on worker gpu-box-1)"
    assert info.value.remote_type == "ZeroDivisionError"


def test_a_session_is_started_once_and_push_pull_move_variables(ip, plane):
    pulled = variables.pack({"b": [2, 4]}, ["b"], where="remotely")
    fake = plane(msg("execute_reply", status="ok"), result=pulled)
    ip.user_ns["a"] = [1, 2]
    ip.run_cell_magic(
        "gpulayer", "--session train --gpus 2 --push a --pull b", "b = [x * 2 for x in a]"
    )
    ip.run_cell_magic("gpulayer", "--session train", "pass")
    assert ip.user_ns["b"] == [2, 4]
    creates = [r for r in fake.requests if r.method == "POST" and r.url.path.endswith("/sessions")]
    assert len(creates) == 1
    assert json.loads(creates[0].content)["resources"]["gpus"] == 2
    first, second = fake.submitted
    assert first.cell.session == "train" and first.resources.gpus == 0  # the session holds GPUs
    assert variables.unpack(first.cell.push) == {"a": [1, 2]} and first.cell.pull == ["b"]
    assert second.cell.push is None


def test_api_access_reaches_the_cell_or_the_session_it_starts(ip, plane):
    fake = plane(msg("execute_reply", status="ok"))
    ip.run_cell_magic("gpulayer", "--api-access", "pass")
    ip.run_cell_magic("gpulayer", "--session nested --api-access", "pass")
    ip.run_cell_magic("gpulayer", "", "pass")
    plain, _, without = fake.submitted
    assert plain.api_access and not without.api_access
    (create,) = [
        r for r in fake.requests if r.method == "POST" and r.url.path.endswith("/sessions")
    ]
    assert json.loads(create.content)["api_access"] is True


def test_queue_timeout_reaches_the_cell(ip, plane):
    fake = plane(msg("execute_reply", status="ok"))
    ip.run_cell_magic("gpulayer", "--queue-timeout 1h30m --no-wait", "pass")
    assert fake.submitted[-1].queue_timeout == 5400


def test_no_wait_returns_the_job(ip, plane):
    plane(msg("execute_reply", status="ok"))
    job = ip.run_cell_magic("gpulayer", "--no-wait", "train()")
    assert job.id == "j1" and str(job.state) == "scheduled"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("--gpus two", "invalid int value"),
        ("--gpus -1", "--gpus must be 0 or more"),
        ("--timeout soon", "is not a duration"),
        ("--queue-timeout soon", "is not a duration"),
        ("--pull c --no-wait", "--pull needs the cell to finish here"),
        ("--push nope", "'nope' is not defined in this notebook"),
        ("--push 1x", "'1x' is not a Python variable name"),
        ("--idle-timeout 5m", "--idle-timeout applies to a --session"),
        ("--gpu-memory lots", "gpu_memory"),
        ("--frobnicate", "unrecognized arguments"),
        ("--nodes 2 --session s", "drop --session"),
        ("--nodes 0", "nodes"),
        ("--nproc-per-node 2 --launcher mpi", "invalid choice"),
    ],
)
def test_bad_options_raise_usage_errors(ip, plane, line, problem):
    plane()
    with pytest.raises(UsageError, match=re.escape(problem)):
        ip.run_cell_magic("gpulayer", line, "pass")


def test_line_magics(ip, plane, capsys):
    fake = plane()
    fake.sessions["s"] = contracts.Session(name="s", job_id="s1", state="running", owner="ada",
                                           worker_name="w1", gpu_indices=[0, 1],
                                           idle_timeout=1800, created_at=NOW)  # fmt: skip
    ip.run_line_magic("gpulayer", "sessions")
    ip.run_line_magic("gpulayer", "end s")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "STATE", "WORKER", "GPUS", "CELLS", "IDLE", "TIMEOUT"]
    assert out[1].split() == ["s", "running", "w1", "0,1", "0", "30m00s"]
    assert out[2] == "session s ended"
    with pytest.raises(UsageError, match="unknown %gpulayer command 'frob'"):
        ip.run_line_magic("gpulayer", "frob")
    with pytest.raises(UsageError, match="needs a job id"):
        ip.run_line_magic("gpulayer", "logs")


def test_long_messages_are_joined_from_fragments():
    big = "x" * 150_000
    from gpulayer.worker.kernels import encode

    lines = encode(contracts.KernelMessage(msg_type="stream", content={"text": big}))
    assert len(lines) == 3 and all(len(t) <= 60_001 for t in lines)
    decoder = cells.MessageDecoder()
    got = [decoder.feed(t) for t in lines]
    assert got[:2] == [None, None] and got[2].content["text"] == big
