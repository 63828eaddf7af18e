"""The live channel end to end (docs/channel.md): a real control plane and real
``gpulayer join`` workers, the public client, and raw WebSockets where the test
plays a peer (a worker that receives a pushed assignment, a bad token, an
oversized frame).

The fallback runs through a small TCP proxy that refuses every WebSocket upgrade
(403), as a proxy that blocks WebSockets does, and passes everything else.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.sync.client import connect
from websockets.uri import parse_uri
from websockets.utils import accept_key

import gpulayer as gl
from gpulayer import contracts
from gpulayer.client import Connection
from gpulayer.client import channel as client_channel
from gpulayer.client.cells import ensure_session
from gpulayer.client.cells import submit as submit_cell
from tests.support import until

pytestmark = pytest.mark.timeout(240)


def _ws(cluster, path: str) -> str:
    return "ws" + cluster.url.removeprefix("http").rstrip("/") + contracts.API_PREFIX + "/" + path


def _open(cluster, path: str, token: str, **kw):
    ws = connect(_ws(cluster, path), additional_headers={"Authorization": f"Bearer {token}"},
                 open_timeout=20, **kw)  # fmt: skip
    return contextlib.ExitStack().enter_context(ws)  # as a context: no legacy warning


def _call(ws, id_: int, method: str, path: str, body=None, **query) -> contracts.ChannelAnswer:
    call = contracts.ChannelCall(id=id_, method=method, path=path, query=query,
                                 body=None if body is None else json.dumps(body))  # fmt: skip
    ws.send(call.model_dump_json())
    while True:
        frame = json.loads(ws.recv(timeout=60))
        if frame["type"] == "answer" and frame["id"] == id_:
            return contracts.ChannelAnswer.model_validate(frame)


# ------------------------------------------------------------- the channel path


def test_a_function_call_and_a_map_travel_over_the_channel(conn):
    @gl.remote(connection=conn)
    def double(x):
        print("doubling", x)
        return 2 * x

    assert double.run(21) == 42
    assert conn.channel_open  # the submit and its wait went over the WebSocket
    assert list(double.map(range(20))) == [2 * x for x in range(20)]
    call = double.spawn(5)
    assert call.result(timeout=60) == 10
    assert call.logs() == ["doubling 5"]


def test_threads_sharing_a_channel_each_get_their_own_answers_while_one_long_polls(conn):
    """The caller that reads the socket hands the others their answers (ADR 0144): a
    long poll in one thread holds up no call of another, and no answer is crossed."""

    @gl.remote(connection=conn)
    def echo(x):
        return x

    assert echo.run(0) == 0  # the channel is open
    sleeper = gl.submit("sleep 60", connection=conn)
    polled: list[float] = []

    def long_poll() -> None:
        t = time.monotonic()
        assert conn.wait_any([sleeper.id], 3.0) == []  # held the whole 3 s
        polled.append(time.monotonic() - t)

    results: dict[int, list[int]] = {}

    def calls(n: int) -> None:
        results[n] = [echo.run(n * 1000 + i) for i in range(20)]

    try:
        poller = threading.Thread(target=long_poll)
        poller.start()
        time.sleep(0.2)  # the long poll is in flight first
        callers = [threading.Thread(target=calls, args=(n,)) for n in range(3)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(timeout=60)
        assert poller.is_alive(), "the quick calls waited for the long poll"
        poller.join(timeout=30)
    finally:
        conn.cancel(sleeper.id)
    assert results == {n: [n * 1000 + i for i in range(20)] for n in range(3)}
    assert polled and polled[0] >= 2.5
    assert conn.channel_open


def test_a_command_jobs_logs_are_followed_live(conn):
    job = gl.submit("for i in $(seq 1 30); do echo line $i; sleep 0.02; done", connection=conn)
    lines = [line.text for line in conn.follow_logs(job.id) if line.stream == "stdout"]
    assert lines == [f"line {i}" for i in range(1, 31)]
    assert conn.channel_open
    assert conn.wait(job.id).state == "succeeded"


def test_gpulayer_logs_follow_prints_each_line_once(cluster, conn):
    job = gl.submit("for i in 1 2 3; do echo out $i; sleep 0.1; done", connection=conn)
    env = {**os.environ, "GPULAYER_URL": cluster.url, "GPULAYER_TOKEN": cluster.admin_token,
           "GPULAYER_CONFIG": "/nonexistent/gpulayer.json"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "gpulayer", "logs", "-f", job.id], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [x for x in done.stdout.splitlines() if x.startswith("out")] == ["out 1", "out 2",
                                                                            "out 3"]  # fmt: skip


def _texts(run) -> list[str]:
    return [m.content["text"] for m in run.messages() if m.msg_type == "stream"]


def test_a_session_cell_is_answered_over_the_channel(conn):
    ensure_session(conn, "chan")
    until(lambda: conn.session("chan").state == "running", 90, "the session's kernel")
    first = submit_cell(conn, "x = 6 * 7\nprint('x is', x)", session="chan")
    assert _texts(first) == ["x is 42\n"]
    assert first.reply is not None and first.reply["status"] == "ok"
    assert conn.channel_open
    second = submit_cell(conn, "print(x + 1)", session="chan")  # the warm kernel kept x
    assert _texts(second) == ["43\n"]
    # Both counted for the session they ran in (its reply rode each cell's end)
    until(lambda: conn.session("chan").cells == 2, 30, "the session to count its cells")
    conn.end_session("chan")


def test_a_worker_receives_its_assignment_pushed_and_completes_over_the_channel(cluster, conn):
    reg = contracts.WorkerRegistration(
        name="pushed", hostname="h", cpus=1, memory_bytes=2**30, slots=1,
        labels={"only": "pushed"}, version=gl.__version__, python="3.11",
    )  # fmt: skip
    api = cluster.url.rstrip("/") + contracts.API_PREFIX + "/"
    answer = httpx.post(api + "workers/register", content=reg.model_dump_json(),
                        headers={"Authorization": f"Bearer {cluster.join_token}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    got = contracts.Registered.model_validate_json(answer.content)
    try:
        with _open(cluster, f"workers/{got.worker_id}/channel", got.token) as ws:
            # A new channel's first push comes at once, empty here, with a fresh seq
            # (docs/adr/0150).
            synced = contracts.ChannelPush.model_validate_json(ws.recv(timeout=60)).acquired
            assert synced.assignments == [] and synced.seq > 0
            job = gl.submit("true", selector={"only": "pushed"}, connection=conn)
            push = contracts.ChannelPush.model_validate_json(ws.recv(timeout=60))
            (assignment,) = push.acquired.assignments
            assert push.acquired.seq > synced.seq
            assert assignment.job_id == job.id
            assert conn.job(job.id).state == "running"  # taken the durable way, as an acquire
            batch = {"seq": 0, "lines": [{"stream": "stdout", "text": "hi", "ts": time.time()}]}
            logs = _call(ws, 1, "POST", f"tasks/{assignment.task_id}/logs", batch)
            assert logs.status == 200 and json.loads(logs.body)["next_seq"] == 1
            done = {"state": "succeeded", "exit_code": 0}
            answered = _call(ws, 2, "POST", f"tasks/{assignment.task_id}/complete", done)
            assert answered.status == 200, answered.body
            assert conn.wait(job.id, timeout=30).state == "succeeded"
            assert [ln.text for ln in conn.follow_logs(job.id) if ln.stream == "stdout"] == ["hi"]
            # A route the worker channel does not carry is a 404 answer; the channel lives on.
            nope = _call(ws, 3, "POST", "jobs", {"command": "true"})
            assert nope.status == 404
    finally:
        conn.forget_worker("pushed")


# ------------------------------------------------------------------------ auth


def test_a_bad_token_is_refused_at_the_handshake(cluster, conn):
    with pytest.raises(InvalidStatus) as bad:
        _open(cluster, "channel", "gl_" + "A" * 43)
    assert bad.value.response.status_code == 401
    assert json.loads(bad.value.response.body)["code"] == "unauthenticated"
    with pytest.raises(InvalidStatus) as none:
        connect(_ws(cluster, "channel"), open_timeout=20)
    assert none.value.response.status_code == 401
    # A viewer is no worker: the worker channel is 403 before any upgrade.
    viewer = conn.create_token(contracts.CreateToken(name="chan-viewer", role="viewer")).token
    with pytest.raises(InvalidStatus) as other:
        _open(cluster, "workers/x1/channel", viewer)
    assert other.value.response.status_code == 403
    conn.revoke_token("chan-viewer")


def test_a_revoked_tokens_channel_is_closed_and_cannot_open_again(cluster, conn):
    made = conn.create_token(contracts.CreateToken(name="revoke-me", role="viewer"))
    with _open(cluster, "channel", made.token) as ws:
        assert _call(ws, 1, "GET", "jobs/nope").status == 404  # open and answering
        conn.revoke_token("revoke-me")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == contracts.CLOSE_UNAUTHORIZED
    with pytest.raises(InvalidStatus) as again:
        _open(cluster, "channel", made.token)
    assert again.value.response.status_code == 401


def test_an_oversized_frame_closes_only_that_channel(cluster, conn):
    with _open(cluster, "channel", cluster.admin_token, max_size=None) as ws:
        with pytest.raises(ConnectionClosed) as closed:  # over max_body_bytes: closed
            ws.send("x" * (8 * 1024 * 1024 + 1))  # (tornado reads the length, not the rest)
            ws.recv(timeout=30)
        code = closed.value.rcvd.code if closed.value.rcvd is not None else None
        assert code in (1009, None)  # 1009, unless the unread rest reset the socket first
    with _open(cluster, "channel", cluster.admin_token) as fine:
        assert _call(fine, 7, "GET", "jobs/nope").status == 404
    assert conn.health().status == "ok"


def _raw_channel(cluster, rcvbuf: int | None = None) -> tuple[socket.socket, ClientProtocol]:
    """An open client channel whose bytes the test writes (and reads) itself;
    ``rcvbuf``: its socket's receive buffer, set before it connects."""
    uri = parse_uri(_ws(cluster, "channel"))
    protocol = ClientProtocol(uri, max_size=None)
    request = protocol.connect()
    request.headers["Authorization"] = f"Bearer {cluster.admin_token}"
    protocol.send_request(request)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect((uri.host, uri.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"".join(protocol.data_to_send()))
    while protocol.state is not State.OPEN:
        protocol.receive_data(sock.recv(65536))
        assert protocol.state is not State.CLOSED, protocol.handshake_exc
    protocol.events_received()  # the handshake's response
    return sock, protocol


def _frames_of(protocol: ClientProtocol, send) -> bytes:
    send(protocol)
    return b"".join(protocol.data_to_send())


def _read_until(sock, protocol, answers: dict[int, int], pongs: list[bytes], ids, n_pongs=0):
    while not (set(ids) <= answers.keys() and len(pongs) >= n_pongs):
        data = sock.recv(65536)
        assert data, "the control plane closed the channel"
        protocol.receive_data(data)
        for event in protocol.events_received():
            if event.opcode is Opcode.PONG:
                pongs.append(event.data)
            elif event.opcode is Opcode.TEXT:
                answer = contracts.ChannelAnswer.model_validate_json(event.data)
                answers[answer.id] = answer.status


def test_frames_are_taken_however_the_bytes_arrive(cluster):
    """Frames packed into one write, a message in fragments with a ping between
    them, a frame larger than one read of the socket, and frames that arrive a
    byte at a time: every call is answered and every ping ponged (the control
    plane takes frames out of whole reads of its socket, docs/adr/0160)."""

    def call(id_: int, pad: int = 0) -> bytes:
        text = contracts.ChannelCall(id=id_, method="GET", path="jobs/nope").model_dump_json()
        return (text[:-1] + " " * pad + "}").encode()

    sock, protocol = _raw_channel(cluster)
    with sock:
        big = call(3, pad=300_000)  # several reads of the socket
        third = len(call(2)) // 3
        packed = _frames_of(protocol, lambda p: (
            p.send_text(call(1)),
            p.send_ping(b"one"),
            p.send_text(call(2)[:third], fin=False),
            p.send_ping(b"two"),  # a control frame between fragments
            p.send_continuation(call(2)[third:2 * third], fin=False),
            p.send_continuation(call(2)[2 * third:], fin=True),
            p.send_text(big),
            p.send_text(call(4)),
        ))  # fmt: skip
        sock.sendall(packed)
        answers: dict[int, int] = {}
        pongs: list[bytes] = []
        _read_until(sock, protocol, answers, pongs, {1, 2, 3, 4}, n_pongs=2)
        assert answers == {1: 404, 2: 404, 3: 404, 4: 404}
        assert pongs == [b"one", b"two"]
        trickled = _frames_of(protocol, lambda p: (p.send_text(call(5)), p.send_text(call(6))))
        for i in range(len(trickled)):
            sock.sendall(trickled[i : i + 1])
        _read_until(sock, protocol, answers, pongs, {5, 6})
        assert answers[5] == answers[6] == 404


def test_answers_sent_while_a_large_one_waits_arrive_whole_and_in_order(cluster, conn):
    """A large answer the peer is slow to read waits, partly unsent, in the server's
    buffer; small answers written meanwhile queue behind it instead of going to the
    socket at once (docs/adr/0160): every frame arrives whole."""
    job = gl.submit("python -c \"[print('y' * 300) for _ in range(10000)]\"", connection=conn)
    assert conn.wait(job.id, timeout=120).state == "succeeded"
    logs = contracts.ChannelCall(id=0, method="GET", path=f"jobs/{job.id}/logs",
                                 query={"limit": "10000"})  # fmt: skip
    sock, protocol = _raw_channel(cluster, rcvbuf=4096)
    with sock:
        sock.sendall(_frames_of(protocol, lambda p: p.send_text(logs.model_dump_json().encode())))
        # The ~4 MB answer has begun: more than the kernel's buffers on both sides
        # hold, so part of it waits in the server's own while the peer reads nothing.
        protocol.receive_data(sock.recv(1024))
        assert not protocol.events_received()
        small = range(1, 41)
        for i in small:  # each answered (a 404) while the large one waits unsent
            call = contracts.ChannelCall(id=i, method="GET", path=f"jobs/nope-{i}")
            sock.sendall(
                _frames_of(protocol, lambda p, c=call: p.send_text(c.model_dump_json().encode()))
            )
        order: list[int] = []
        bodies: dict[int, str] = {}
        while len(order) < 1 + len(small):
            data = sock.recv(65536)
            assert data, "the control plane closed the channel"
            protocol.receive_data(data)
            assert protocol.state is State.OPEN, protocol.parser_exc
            for event in protocol.events_received():
                answer = contracts.ChannelAnswer.model_validate_json(event.data)
                order.append(answer.id)
                bodies[answer.id] = answer.body
    assert order[0] == 0 and sorted(order[1:]) == list(small)
    lines = contracts.LogPage.model_validate_json(bodies[0]).lines
    assert [line.offset for line in lines] == list(range(10000))
    printed = [line.text for line in lines if line.stream == contracts.LogStream.stdout]
    assert len(printed) > 9900 and set(printed) == {"y" * 300}


def test_a_call_answered_as_its_end_over_the_channel(cluster, conn):
    """``POST jobs?wait=S&answer=end`` over the channel: the ``JobEnd`` the control
    plane makes from the job's records as it ends is what the whole job says."""
    from gpulayer import payload

    spec = gl.remote(lambda: 41 + 1, connection=conn).spec_for([((), {})], conn)
    body = json.loads(spec.model_dump_json())
    with _open(cluster, "channel", cluster.admin_token) as ws:
        answer = _call(ws, 1, "POST", "jobs", body=body, wait="30", answer="end")
        assert answer.status == 201 and "spec" not in json.loads(answer.body)
        end = contracts.JobEnd.model_validate_json(answer.body)
        assert end.state == "succeeded" and end == contracts.JobEnd.of(conn.job(end.id))
        (outcome,) = payload.unpack(end.result, "outcomes")
        assert outcome.ok and outcome.value == 42
        refused = _call(ws, 2, "POST", "jobs", body=body, wait="30", answer="everything")
        assert refused.status == 400 and json.loads(refused.body)["field"] == "answer"
        # A repeat with the same key answers the job the first one stored, as its end too.
        keyed = contracts.ChannelCall(id=3, method="POST", path="jobs", idempotency_key="k-1",
                                      query={"wait": "30", "answer": "end"},
                                      body=spec.model_dump_json())  # fmt: skip
        answers = []
        for _ in range(2):
            ws.send(keyed.model_dump_json())
            while (frame := json.loads(ws.recv(timeout=60)))["type"] != "answer":
                pass
            answers.append(contracts.ChannelAnswer.model_validate(frame))
        first, again = (contracts.JobEnd.model_validate_json(a.body) for a in answers)
        assert [a.status for a in answers] == [201, 200] and first == again
        assert first.state == "succeeded" and "spec" not in json.loads(answers[1].body)


def test_calls_in_flight_past_the_limit_are_answered_429(cluster, conn):
    job = gl.submit("sleep 60", connection=conn)
    try:
        with _open(cluster, "channel", cluster.admin_token) as ws:
            held = contracts.WaitAny(ids=[job.id], timeout=30).model_dump_json()
            for i in range(70):  # 64 may wait at once (channel_max_calls)
                call = contracts.ChannelCall(id=i, method="POST", path="jobs/wait", body=held)
                ws.send(call.model_dump_json())
            refused = [contracts.ChannelAnswer.model_validate_json(ws.recv(timeout=30))
                       for _ in range(6)]  # fmt: skip
            assert {a.status for a in refused} == {429}
            assert {a.id for a in refused} == set(range(64, 70))
    finally:
        conn.cancel(job.id)


def _channels_open(cluster) -> int:
    """``gpulayer_channels`` as the control plane's metrics say it now."""
    auth = {"Authorization": f"Bearer {cluster.admin_token}"}
    resp = httpx.get(cluster.url + "gpulayer/metrics", headers=auth, timeout=30)
    resp.raise_for_status()
    for line in resp.text.splitlines():
        if line.startswith("gpulayer_channels "):
            return int(float(line.split()[1]))
    raise AssertionError("no gpulayer_channels series in the metrics")


def test_a_peer_that_stops_reading_is_cut_off_and_resumes_over_a_new_channel(fresh_cluster):
    calls = 120
    c = fresh_cluster(
        workers=1, slots=1, server_args=["--GpulayerApp.channel_max_unsent_bytes=200000"]
    )
    with c.connection() as conn:
        job = gl.submit("python -c \"[print('y' * 100) for _ in range(3000)]\"", connection=conn)
        assert conn.wait(job.id, timeout=120).state == "succeeded"
        before = _channels_open(c)  # the worker's channel and this connection's
        # A peer that takes each answer keeps its channel, however much it is sent in
        # all: what the socket took at once no longer counts as unsent.
        with _open(c, "channel", c.admin_token, max_size=None) as ws:
            for i in range(5):  # ~360 kB each, 1.8 MB in all
                answer = _call(ws, i, "GET", f"jobs/{job.id}/logs", limit="3000")
                assert answer.status == 200, answer
        until(lambda: _channels_open(c) == before, 30, "the reading peer's channel to close")
        # max_queue=1: the client library stops reading the socket once one frame
        # waits (it reads in a thread of its own), so the answers pile up on the server.
        with _open(c, "channel", c.admin_token, max_size=None, max_queue=1) as ws:
            until(lambda: _channels_open(c) == before + 1, 30, "the channel to be counted")
            # ~360 kB an answer, none read: 43 MB in all, more than the kernel's socket
            # buffers on both sides absorb.
            for i in range(calls):
                call = contracts.ChannelCall(id=i, method="GET", path=f"jobs/{job.id}/logs",
                                             query={"limit": "3000"})  # fmt: skip
                ws.send(call.model_dump_json())
            # While it reads nothing, the server closes the channel for a resync and,
            # the close frame stuck behind the unread answers, cuts the peer off.
            until(lambda: _channels_open(c) == before, 60,
                  "the server to free the channel of a peer that stopped reading")  # fmt: skip
            answered = 0
            with pytest.raises(ConnectionClosed) as closed:  # it reads again: closed
                while True:
                    ws.recv(timeout=60)
                    answered += 1
        assert answered < calls
        # The close frame arrives when it got out before the cut; else the reset says it.
        assert closed.value.rcvd is None or closed.value.rcvd.code == contracts.CLOSE_RESYNC
        # Its next call goes over a new channel and gets the whole answer.
        with _open(c, "channel", c.admin_token, max_size=None) as ws:
            answer = _call(ws, 0, "GET", f"jobs/{job.id}/logs", limit="5000")
        assert answer.status == 200 and answer.body is not None
        page = contracts.LogPage.model_validate_json(answer.body)
        assert [ln.text for ln in page.lines if ln.stream == "stdout"] == ["y" * 100] * 3000
        # A follower resumes from its offset: every line once.
        lines = [ln.text for ln in conn.follow_logs(job.id) if ln.stream == "stdout"]
        assert lines == ["y" * 100] * 3000


# ------------------------------------------------------------------ resuming


def test_a_dropped_channel_resumes_without_lost_or_repeated_lines(conn):
    job = gl.submit("for i in $(seq 1 60); do echo n $i; sleep 0.03; done", connection=conn)
    seen: list[str] = []
    dropped = 0
    for line in conn.follow_logs(job.id):
        if line.stream == "stdout":
            seen.append(line.text)
        if len(seen) in (10, 30) and dropped < len(seen) // 10:
            dropped += 1 if len(seen) == 10 else 2
            _drop(conn)  # close the socket under the follow
    assert seen == [f"n {i}" for i in range(1, 61)]
    assert dropped == 3


def _drop(conn: Connection) -> None:
    """Close the channel's socket under it, as a network failure would."""
    channel = conn._channel  # the test plays the network: no public way to break a socket
    assert channel is not None
    with contextlib.suppress(OSError):
        channel._sock.shutdown(socket.SHUT_RDWR)


# ------------------------------------------------------------------ keepalive


def test_an_idle_clients_channel_answers_the_control_planes_pings_and_stays_open(
    fresh_cluster, monkeypatch
):
    """Nobody reads the socket between calls (the caller reads its own answer, ADR
    0159): the keeper answers the control plane's pings, which closes a channel whose
    pong does not come within its ping interval."""
    monkeypatch.setattr(client_channel, "KEEP_SECONDS", 0.05)
    c = fresh_cluster(workers=1, slots=1, server_args=["--GpulayerApp.channel_ping_seconds=0.2"])
    with c.connection() as conn:
        one = gl.remote(lambda x: x + 1, connection=conn)
        assert one.run(1) == 2
        channel = conn._channel
        assert channel is not None and not channel.closed
        heard = channel._heard
        # Idle for ten ping intervals: pings come and are answered.
        until(lambda: channel._heard > heard + 2.0, 30, "pings over two idle seconds")
        assert not channel.closed
        assert one.run(2) == 3
        assert conn._channel is channel  # the same channel, never reopened


def test_a_close_sent_while_nobody_read_is_seen_before_the_next_call(fresh_cluster):
    """A control plane restarted between two calls closed the channel while nobody
    read it: the next call (one that is never repeated on its own) sees that before
    it is sent, and goes over a new channel."""
    c = fresh_cluster(workers=1, slots=1)
    with c.connection() as conn:
        job = gl.submit("true", connection=conn)
        assert conn.wait(job.id, timeout=60).state == "succeeded"
        old = conn._channel
        assert old is not None and not old._closed
        c.restart_control_plane()  # SIGTERM: it closes its channels (1001), then stops
        assert conn.job(job.id).state == "succeeded"  # a plain read: not retried on a drop
        assert old.closed and conn._channel is not old and conn.channel_open


def test_a_control_plane_that_goes_silent_is_noticed_while_nobody_calls(monkeypatch):
    """The keeper pings a channel that has been silent for ``PING_SECONDS`` and
    gives it up when nothing comes back for as long again."""
    monkeypatch.setattr(client_channel, "KEEP_SECONDS", 0.05)
    monkeypatch.setattr(client_channel, "PING_SECONDS", 0.3)
    server = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def accept_then_go_silent() -> None:
        peer, _ = server.accept()
        with peer:
            request = b""
            while b"\r\n\r\n" not in request:
                request += peer.recv(4096)
            key = next(line.split(b":", 1)[1].strip().decode()
                       for line in request.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key"))  # fmt: skip
            peer.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: "
                         + accept_key(key).encode() + b"\r\n\r\n")  # fmt: skip
            peer.settimeout(30)
            with contextlib.suppress(OSError):
                while data := peer.recv(4096):  # read, never answer
                    received.extend(data)

    threading.Thread(target=accept_then_go_silent, daemon=True).start()
    api = f"http://127.0.0.1:{server.getsockname()[1]}/gpulayer/api"
    channel = client_channel.Channel.open(api, "gl_test", tls=False, timeout=10)
    try:
        assert not channel.closed
        until(lambda: channel.closed, 30, "the silent channel to be given up")
        assert received[:1] == b"\x89"  # its first frame was a ping (FIN + opcode 9)
        with pytest.raises(client_channel.ChannelClosed, match="did not answer a ping"):
            channel.call(contracts.ChannelCall(id=0, method="GET", path="jobs/x"), 5)
    finally:
        channel.close()
        server.close()


# ------------------------------------------------------------------- fallback


REFUSAL = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class BlockingProxy:
    """A TCP proxy that answers every WebSocket upgrade 403 and passes the rest."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.refused = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                client.close()
                return
            head += chunk
        if b"upgrade: websocket" in head.lower():
            self.refused += 1
            client.sendall(
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            client.close()
            return
        with client, socket.create_connection(self.upstream) as up:
            up.sendall(head)
            back = threading.Thread(target=self._pipe, args=(up, client), daemon=True)
            back.start()
            self._pipe(client, up)
            back.join()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def gl_proxy(cluster) -> Iterator[BlockingProxy]:
    host, port = cluster.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    proxy = BlockingProxy((host, int(port)))
    yield proxy
    proxy.close()


def _through(cluster, proxy: BlockingProxy) -> str:
    host_port = cluster.url.split("//", 1)[1].split("/", 1)[0]
    return cluster.url.replace(host_port, f"127.0.0.1:{proxy.port}")


def test_with_websockets_blocked_a_worker_and_a_client_fall_back_to_long_polls(
    cluster, gl_proxy, tmp_path: Path
):
    url = _through(cluster, gl_proxy)
    log_path = tmp_path / "worker.log"
    env = {**os.environ, "GPULAYER_JOIN_TOKEN": cluster.join_token}
    with open(log_path, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "join", url, "--name", "behind-proxy",
             "--slots", "1", "--label", "only=proxy", "--data-dir", str(tmp_path / "w")],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with Connection(url, cluster.admin_token) as conn:
            ready = lambda: any(w.name == "behind-proxy" and w.state == "ready"  # noqa: E731
                                for w in conn.workers())  # fmt: skip
            until(ready, 60, "the worker behind the proxy")

            @gl.remote(connection=conn, selector={"only": "proxy"})
            def square(x):
                return x * x

            assert square.run(9) == 81  # assigned by a long poll, answered over HTTP
            assert not conn.channel_open
            assert list(square.map(range(5))) == [0, 1, 4, 9, 16]
            job = gl.submit("for i in 1 2 3; do echo p $i; sleep 0.05; done",
                            selector={"only": "proxy"}, connection=conn)  # fmt: skip
            lines = [ln.text for ln in conn.follow_logs(job.id) if ln.stream == "stdout"]
            assert lines == ["p 1", "p 2", "p 3"]
            cell = submit_cell(conn, "print(6 * 7)", selector={"only": "proxy"})
            assert _texts(cell) == ["42\n"]
            assert not conn.channel_open
        assert gl_proxy.refused >= 2  # the worker's upgrade and the client's were refused
        assert "no live channel (upgrade refused (HTTP 403))" in log_path.read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        with Connection(cluster.url, cluster.admin_token) as admin:
            admin.forget_worker("behind-proxy")


def test_gpulayer_channel_http_never_opens_one(cluster):
    with Connection(cluster.url, cluster.admin_token, channel="http") as conn:

        @gl.remote(connection=conn)
        def one():
            return 1

        assert one.run() == 1
        assert not conn.channel_open
