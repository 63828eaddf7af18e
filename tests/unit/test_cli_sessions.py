"""``gpulayer sessions`` / ``gpulayer session end`` and how ``gpulayer logs`` prints a cell."""

from datetime import UTC, datetime

import httpx

from gpulayer import cli, client, contracts

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def conn_for(handler) -> client.Connection:
    return client.Connection("http://x/", "gl_t", transport=httpx.MockTransport(handler))


def test_sessions_and_session_end(capsys):
    seen = []
    session = contracts.Session(name="train", job_id="s1", state="running", owner="ada",
                                worker_name="gpu-box-1", gpu_indices=[0], idle_timeout=3600,
                                created_at=NOW)  # fmt: skip

    def handler(request):
        seen.append((request.method, request.url.path.rsplit("/api/v1/", 1)[1]))
        if request.method == "DELETE":
            return httpx.Response(204)
        body = contracts.SessionList(sessions=[session]).model_dump_json()
        return httpx.Response(200, content=body.encode())

    assert cli.main(["sessions"], connection=conn_for(handler)) == 0
    assert cli.main(["session", "end", "train"], connection=conn_for(handler)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["NAME", "STATE", "OWNER", "WORKER", "GPUS", "CELLS"]
    assert out[1].split()[:6] == ["train", "running", "ada", "gpu-box-1", "0", "0"]
    assert out[2] == "session train ended"
    assert seen == [("GET", "sessions"), ("DELETE", "sessions/train")]


def test_logs_prints_a_cells_messages_as_text(capsys):
    msgs = [
        contracts.KernelMessage(msg_type="stream", content={"name": "stdout", "text": "hi\n"}),
        contracts.KernelMessage(msg_type="display_data",
                                content={"data": {"image/png": "x", "text/plain": "<Figure>"}}),
        contracts.KernelMessage(msg_type="execute_reply", content={"status": "ok"}),
    ]  # fmt: skip
    lines = [contracts.LogLine(offset=i, stream="iopub", ts=NOW, text=m.model_dump_json())
             for i, m in enumerate(msgs)]  # fmt: skip

    def handler(request):
        offset = int(request.url.params["offset"])
        page = contracts.LogPage(lines=lines[offset:], next_offset=len(lines), complete=True)
        return httpx.Response(200, content=page.model_dump_json().encode())

    assert cli.main(["logs", "j1"], connection=conn_for(handler)) == 0
    assert capsys.readouterr().out == "hi\n<Figure>\n"
