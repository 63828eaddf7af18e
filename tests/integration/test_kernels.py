"""gpulayer kernels end to end (docs/kernels.md): a kernelspec installed by
``gpulayer kernel install`` into a private Jupyter data dir, started by jupyter_client's
``AsyncKernelManager`` in this process (the provisioner, as a Jupyter server runs it),
a real control plane subprocess and a real ``gpulayer join`` worker whose ipykernel
holds the reserved GPUs. The Jupyter client only ever talks to 127.0.0.1 ports.
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gpulayer import contracts, errors
from gpulayer.cli import main
from gpulayer.client import Connection, config
from gpulayer.cluster import LocalCluster

from ..support import until, until_async

pytestmark = pytest.mark.timeout(180)

GRACE = 3.0  # the cluster's kernel_detach_seconds
IDLE = 2.0  # the idle timeout of kernelspec "idle"


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One control plane (short detach grace) and one worker with two simulated GPUs."""
    c = LocalCluster(
        tmp_path_factory.mktemp("kcluster"),
        workers=1,
        slots=2,
        simulated_gpus="2xA100-80GB",
        heartbeat_seconds=0.5,
        lease_seconds=4.0,
        server_args=[
            f"--GpulayerApp.kernel_detach_seconds={GRACE}",
            "--GpulayerApp.sweep_seconds=0.2",
        ],
    )
    with c:
        yield c


@pytest.fixture
def kernels(
    kcluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Connection]:
    """This process is a Jupyter server configured for the cluster, with gpulayer
    kernelspecs ``gl1`` (1 GPU) and ``gl8`` (8 GPUs: no worker fits) installed."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("GPULAYER_URL", kcluster.url)
    monkeypatch.setenv("GPULAYER_TOKEN", kcluster.admin_token)
    monkeypatch.setenv("GPULAYER_CONFIG", str(tmp_path / "absent.json"))
    assert main(["kernel", "install", "--name", "gl1", "--gpus", "1", "--user",
                 "--env", "GL_MODE=fast"]) == 0  # fmt: skip
    assert main(["kernel", "install", "--name", "gl8", "--gpus", "8",
                 "--start-timeout", "3s"]) == 0  # fmt: skip
    assert main(["kernel", "install", "--name", "idle", "--gpus", "0",
                 "--idle-timeout", f"{IDLE:g}s"]) == 0  # fmt: skip
    assert main(["kernel", "install", "--name", "synced", "--gpus", "0", "--sync-workdir"]) == 0
    assert main(["kernel", "install", "--name", "cpu", "--gpus", "0"]) == 0
    with kcluster.connection() as conn:
        yield conn


@asynccontextmanager
async def started(name: str = "gl1", **start: Any) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    km = AsyncKernelManager(kernel_name=name)
    await km.start_kernel(**start)
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=not await km.is_alive())


async def run(
    kc: Any, code: str, stdin: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code`` (answering ``input()`` with ``stdin``); its reply and iopub messages."""
    msg_id = kc.execute(code, allow_stdin=stdin is not None)
    if stdin is not None:
        request = await kc.get_stdin_msg(timeout=30)
        assert request["msg_type"] == "input_request"
        kc.input(stdin)
    seen = []
    while True:
        msg = await kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return await reply_to(kc, msg_id), seen


async def reply_to(kc: Any, msg_id: str) -> dict[str, Any]:
    """The shell reply to ``msg_id`` (a late reply to an earlier request is skipped)."""
    while True:
        reply: dict[str, Any] = await kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def stdout(seen: list[dict[str, Any]]) -> str:
    """What the code printed to stdout (a warning on stderr is not counted)."""
    return "".join(
        m["content"]["text"]
        for m in seen
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def test_a_notebook_runs_on_the_worker_with_its_gpu(kernels: Connection) -> None:
    async def main_() -> None:
        async with started() as (km, kc):
            job_id = km.provisioner.job_id
            job = kernels.job(job_id)
            assert job.state == "running" and job.spec.session.relay
            # The Jupyter side's sockets are files in a folder only this user may enter.
            assert km.transport == "ipc"
            assert os.stat(os.path.dirname(km.ip)).st_mode & 0o777 == 0o700
            code = "import os, socket; e = os.environ\n" + (
                "print(e['CUDA_VISIBLE_DEVICES'], socket.gethostname(), e['GL_MODE'])"
            )
            reply, seen = await run(kc, code)
            assert reply["content"]["status"] == "ok"
            gpus, host, mode = stdout(seen).split()
            assert len(gpus.split(",")) == 1 and host == socket.gethostname() and mode == "fast"

            _, seen = await run(kc, "from IPython.display import HTML; HTML('<b>remote</b>')")
            results = [m for m in seen if m["msg_type"] == "execute_result"]
            assert results[0]["content"]["data"]["text/html"] == "<b>remote</b>"

            reply, seen = await run(kc, "name = input('who? '); print('hello', name)", stdin="ada")
            assert "hello ada" in stdout(seen)

            reply = await reply_to(kc, kc.complete("import o", 8))
            assert "os" in reply["content"]["matches"]
            reply = await reply_to(kc, kc.inspect("name", 4))
            assert reply["content"]["found"]

            # A widget made remotely; the client moves it; the kernel sees the value.
            _, seen = await run(kc, "import ipywidgets as w; s = w.IntSlider(3); s")
            models = {m["content"]["data"]["state"].get("_model_name"): m["content"]["comm_id"]
                      for m in seen if m["msg_type"] == "comm_open"}  # fmt: skip
            update = {"method": "update", "state": {"value": 42}, "buffer_paths": []}
            comm = {"comm_id": models["IntSliderModel"], "data": update}
            kc.shell_channel.send(kc.session.msg("comm_msg", comm))
            _, seen = await run(kc, "print(s.value)")
            assert stdout(seen) == "42\n"
        # Shut down: the job ends succeeded, its GPU is free again.
        done = await asyncio.to_thread(kernels.wait, job_id, 30)
        assert done.state == "succeeded", done.reason

    asyncio.run(main_())


def test_nbclient_runs_a_notebook_on_the_gpulayer_kernel(kernels: Connection) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
        "from IPython.display import HTML, display\n"
        "display(HTML('<i>from the worker</i>'))",
        "import ipywidgets as w; s = w.IntSlider(5, description='x'); s",
        "s.value = 9; s.value",
    )]  # fmt: skip
    client = NotebookClient(nb, kernel_name="gl1", timeout=60, store_widget_state=True)
    client.execute()
    gpus, html, widget, value = (cell.outputs for cell in nb.cells)
    assert gpus[0]["text"].strip() in ("0", "1")
    assert html[0]["data"]["text/html"] == "<i>from the worker</i>"
    assert "application/vnd.jupyter.widget-view+json" in widget[0]["data"]
    assert value[0]["data"]["text/plain"] == "9"
    # The widget's comm messages reached nbclient: its state is kept with the notebook.
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    sliders = [m["state"] for m in state.values() if m["model_name"] == "IntSliderModel"]
    assert [(m["description"], m["value"]) for m in sliders] == [("x", 9)]


@contextmanager
def jupyter_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *server_args: str
) -> Iterator[tuple[LocalCluster, httpx.Client]]:
    """A real Jupyter server (``python -m jupyter_server``, the control plane inside as
    in ``jupyter lab``) with a worker, whose gpulayer connection is the file `gpulayer
    up` saves; an HTTP client with its Jupyter token."""
    saved = tmp_path / "connection.json"
    monkeypatch.delenv("GPULAYER_URL")  # the server's gpulayer connection is the file
    monkeypatch.delenv("GPULAYER_TOKEN")
    env = {"GPULAYER_CONFIG": str(saved), "JUPYTER_PATH": os.environ["JUPYTER_PATH"],
           "JUPYTER_DATA_DIR": os.environ["JUPYTER_DATA_DIR"]}  # fmt: skip
    with LocalCluster(tmp_path / "c", workers=1, env=env, simulated_gpus="1xA100-80GB",
                      heartbeat_seconds=0.5, server_args=server_args,
                      server_module="jupyter_server") as c:  # fmt: skip
        config.save(config.ConnectionConfig(url=c.url, token=c.admin_token), saved)
        auth = {"Authorization": f"token {c.jupyter_token}"}
        with httpx.Client(base_url=c.url, headers=auth, timeout=90) as http:
            yield c, http


def kernel_job(conn: Connection, kernel_id: str) -> contracts.Job:
    """The gpulayer job of Jupyter kernel ``kernel_id`` (its label says which)."""
    (job,) = [j for j in conn.jobs() if j.spec.labels.get("gpulayer.dev/kernel") == kernel_id]
    return job


def test_a_jupyter_server_runs_one_as_the_browser_does(
    kernels: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST api/kernels`` starts it; the kernel WebSocket carries what a browser sends."""
    with jupyter_server(tmp_path, monkeypatch) as (c, http):
        started_ = http.post("api/kernels", json={"name": "gl1"})
        assert started_.status_code == 201, started_.text
        kernel_id = started_.json()["id"]
        ws_url = "ws" + c.url.removeprefix("http") + f"api/kernels/{kernel_id}/channels"
        with connect(ws_url, additional_headers=dict(http.headers), open_timeout=30) as ws:
            msg_id = uuid.uuid4().hex
            ws.send(json.dumps(execute_request(msg_id, "import os\n"
                    "print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])")))  # fmt: skip
            text = ""
            while "gpus" not in text:
                msg = json.loads(ws.recv(timeout=60))
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                    text += msg["content"]["text"]
            assert text == "gpus 0\n"
        with c.connection() as conn:
            job = kernel_job(conn, kernel_id)
            assert job.state == "running" and job.spec.session and job.spec.session.relay
            assert http.delete(f"api/kernels/{kernel_id}").status_code == 204
            assert conn.wait(job.id, 30).state == "succeeded"


def test_jupyters_culler_ends_an_idle_kernel_and_frees_its_gpu(
    kernels: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cull = ["--MappingKernelManager.cull_idle_timeout=3", "--MappingKernelManager.cull_interval=1"]
    with jupyter_server(tmp_path, monkeypatch, *cull) as (c, http):
        started_ = http.post("api/kernels", json={"name": "gl1"})
        assert started_.status_code == 201, started_.text
        kernel_id = started_.json()["id"]
        with c.connection() as conn:
            job = kernel_job(conn, kernel_id)
            ended = conn.wait(job.id, 40)  # no client, idle: Jupyter culls it, gpulayer agrees
            assert ended.state == "succeeded", ended.reason
            gone = lambda: http.get(f"api/kernels/{kernel_id}").status_code == 404  # noqa: E731
            assert until(gone, 20, "Jupyter to forget the culled kernel")
            assert until(lambda: not conn.workers()[0].running_tasks, 20, "the GPU to be free")


def execute_request(msg_id: str, code: str) -> dict[str, Any]:
    """An ``execute_request`` as JupyterLab sends it over the kernel WebSocket."""
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": uuid.uuid4().hex,
              "username": "", "version": "5.3", "date": "2026-01-01T00:00:00Z"}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}  # fmt: skip
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content,
            "channel": "shell", "buffers": []}  # fmt: skip


def test_interrupt_restart_and_death_look_as_for_a_local_kernel(kernels: Connection) -> None:
    async def main_() -> None:
        async with started() as (km, kc):
            first = km.provisioner.job_id
            reply, _ = await run(kc, "a = 1")
            assert reply["content"]["status"] == "ok"
            # A cell from another client of this owner is refused: a kernel runs no cells.
            name = kernels.job(first).spec.session.name
            with pytest.raises(errors.Conflict, match="gpulayer kernel"):
                await asyncio.to_thread(kernels.submit, cell_in(name))

            msg_id = kc.execute("while True: pass")
            await busy(kc, msg_id)
            await km.interrupt_kernel()  # interrupt_mode message: a control request
            reply = await reply_to(kc, msg_id)
            assert reply["content"].get("ename") == "KeyboardInterrupt", reply["content"]

            await km.restart_kernel()  # a new kernel in a new job, on the same sockets
            second = km.provisioner.job_id
            assert second != first
            old = await asyncio.to_thread(kernels.wait, first, 30)
            assert old.state == "succeeded", (old.state, old.reason)
            await kc.wait_for_ready(timeout=60)
            _, seen = await run(
                kc, "import os; print('a' in dir(), os.environ['CUDA_VISIBLE_DEVICES'])"
            )
            printed = stdout(seen).split()
            assert len(printed) == 2, [m["content"] for m in seen]
            gone, gpus = printed
            assert gone == "False" and gpus in ("0", "1")

            kc.execute("import os; os._exit(3)")
            await until_async(lambda: dead(km), 30, "the kernel to be seen dead")
            ended = await asyncio.to_thread(kernels.wait, second, 30)
            assert ended.state == "failed", (ended.state, ended.reason)
            assert "the kernel died" in (ended.reason or "")

    asyncio.run(main_())


def test_a_kernel_no_worker_fits_says_why_and_gives_up(
    kernels: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    async def main_() -> None:
        km = AsyncKernelManager(kernel_name="gl8")
        with pytest.raises(RuntimeError, match=r"within 3s.*needs 8 ×"):
            await km.start_kernel()
        # While it waited, the server's log said why (the pending reasons).
        assert any("cannot start" in r.getMessage() and "needs 8 ×" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        queued = [j for j in kernels.jobs() if j.spec.session and j.spec.session.relay
                  and j.state == "queued"]  # fmt: skip
        assert queued == []  # the job was cancelled, nothing waits on

    asyncio.run(main_())


def test_a_jupyter_server_killed_leaves_no_kernel_behind(
    kernels: Connection, tmp_path: Path
) -> None:
    script = tmp_path / "server.py"
    script.write_text(
        "import asyncio\n"
        "from jupyter_client.manager import AsyncKernelManager\n"
        "async def main():\n"
        "    km = AsyncKernelManager(kernel_name='gl1')\n"
        "    await km.start_kernel()\n"
        "    print(km.provisioner.job_id, flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            job_id = proc.stdout.readline().strip()
            assert kernels.job(job_id).state == "running"
        finally:
            proc.send_signal(signal.SIGKILL)  # no shutdown, no cleanup: the relay just drops
    ended = kernels.wait(job_id, GRACE + 20)
    assert ended.state == "succeeded", ended.reason  # ended by the plane, not lost
    assert "no Jupyter client attached" in (ended.reason or "")
    assert until(lambda: idle_worker(kernels), 20, "the worker to be idle, its GPU free")


def test_a_revoked_token_closes_the_relay(
    kernels: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = kernels.create_token(contracts.CreateToken(name="kernel-user", role="submitter"))
    monkeypatch.setenv("GPULAYER_TOKEN", made.token)

    async def main_() -> None:
        async with started() as (km, kc):
            job_id = km.provisioner.job_id
            reply, _ = await run(kc, "b = 2")
            assert reply["content"]["status"] == "ok"
            await asyncio.to_thread(kernels.revoke_token, "kernel-user")
            await until_async(lambda: dead(km), 30, "the relay to close")
            ended = await asyncio.to_thread(kernels.wait, job_id, GRACE + 20)
            assert ended.state in ("succeeded", "cancelled")

    asyncio.run(main_())


def test_idle_expiry_spares_a_busy_kernel_and_is_not_undone_by_a_restart(
    kernels: Connection,
) -> None:
    async def main_() -> None:
        async with started("idle") as (km, kc):
            job_id = km.provisioner.job_id
            # Running code is not idle: a cell longer than the idle timeout completes.
            _, seen = await run(kc, f"import time; time.sleep({IDLE * 2}); print('done')")
            assert stdout(seen) == "done\n"
            assert kernels.job(job_id).state == "running"
            # Then, unused, the kernel is ended as Jupyter's culler would end it...
            ended = await asyncio.to_thread(kernels.wait, job_id, IDLE + 20)
            assert ended.state == "succeeded" and "without use" in (ended.reason or "")
            await until_async(lambda: dead(km), 20, "the kernel to be seen ended")
            assert await km.provisioner.poll() == 0
            # ... and Jupyter's automatic restart (no shutdown asked) does not undo it.
            with pytest.raises(RuntimeError, match="was ended"):
                await km.restart_kernel(now=True)

    asyncio.run(main_())


def test_sync_workdir_ships_the_notebooks_folder(kernels: Connection, tmp_path: Path) -> None:
    notebook_dir = tmp_path / "project"
    (notebook_dir / "data").mkdir(parents=True)
    (notebook_dir / "data" / "numbers.txt").write_text("1 2 3\n")

    async def main_() -> None:
        async with started("synced", cwd=str(notebook_dir)) as (_, kc):
            _, seen = await run(kc, "print(open('data/numbers.txt').read().split())")
            assert stdout(seen) == "['1', '2', '3']\n"

    asyncio.run(main_())


def test_pip_install_in_the_kernel_lands_in_the_kernels_own_folder(
    kernels: Connection, gl_shared_dir: Path
) -> None:
    wheel = tiny_wheel(gl_shared_dir, "glpiptest", "ANSWER = 42\n")  # the task user reads it

    async def main_() -> None:
        async with started("cpu") as (_, kc):
            reply, seen = await run(kc, f"%pip install --no-index --no-deps {wheel}")
            assert reply["content"]["status"] == "ok", stdout(seen)
            assert "Successfully installed glpiptest" in stdout(seen), stdout(seen)
            _, seen = await run(kc, "import glpiptest, sys; print(glpiptest.ANSWER,"
                                    " glpiptest.__file__.startswith(sys.prefix))")  # fmt: skip
            assert stdout(seen) == "42 False\n"  # importable, and not in the worker's Python

    asyncio.run(main_())


def tiny_wheel(folder: Path, name: str, source: str) -> Path:
    """A pure-Python wheel of one module, written by hand (no build backend, no network)."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
        z.writestr(f"{info}/RECORD", "".join(f"{arc},,\n" for arc in files) + f"{info}/RECORD,,\n")
    path.chmod(0o644)
    return path


def test_a_control_plane_restart_keeps_the_kernel_and_its_state(
    kernels: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalCluster(tmp_path / "c", workers=1, slots=1, heartbeat_seconds=0.5,
                      lease_seconds=8.0) as c:  # fmt: skip
        monkeypatch.setenv("GPULAYER_URL", c.url)
        monkeypatch.setenv("GPULAYER_TOKEN", c.admin_token)

        async def main_() -> None:
            async with started("cpu") as (km, kc):
                reply, _ = await run(kc, "a = 5")
                assert reply["content"]["status"] == "ok"
                await asyncio.to_thread(c.restart_control_plane)
                await until_async(lambda: answers(kc), 60, "the relay to be attached again")
                _, seen = await run(kc, "print(a)")  # the same kernel: its state is there
                assert stdout(seen) == "5\n"
                assert await km.is_alive()

        asyncio.run(main_())


def test_only_the_owner_reaches_a_kernels_relay(
    kernels: Connection, kcluster: LocalCluster
) -> None:
    other = kernels.create_token(contracts.CreateToken(name="someone-else", role="submitter"))

    def refused(path: str, token: str) -> int:
        url = "ws" + kcluster.url.removeprefix("http").rstrip("/") + contracts.API_PREFIX + "/"
        with pytest.raises(InvalidStatus) as e:
            connect(url + path, additional_headers={"Authorization": f"Bearer {token}"},
                    open_timeout=20)  # fmt: skip
        return e.value.response.status_code

    async def main_() -> None:
        async with started() as (km, _):
            job_id = km.provisioner.job_id
            path = contracts.KERNEL_CHANNEL_PATH.format(job_id=job_id)
            # Another owner cannot tell it from a job that does not exist.
            assert await asyncio.to_thread(refused, path, other.token) == 404
            assert await asyncio.to_thread(refused, "kernels/nope/channel", other.token) == 404
            # Nobody but a worker opens the worker's end, and only the one running it.
            (worker,) = kernels.workers()
            theirs = f"workers/{worker.id}/kernels/{job_id}/channel"
            assert await asyncio.to_thread(refused, theirs, kcluster.admin_token) == 403
        command = kernels.submit(contracts.JobSpec(kind="command", command=["true"]))
        path = contracts.KERNEL_CHANNEL_PATH.format(job_id=command.id)
        assert await asyncio.to_thread(refused, path, kcluster.admin_token) == 404

    asyncio.run(main_())


# ------------------------------------------------------------------ helpers


def cell_in(session: str) -> contracts.JobSpec:
    return contracts.JobSpec.model_validate(
        {"kind": "cell", "cell": {"source": "print(1)", "session": session}}
    )


async def busy(kc: Any, msg_id: str) -> None:
    """Until the kernel says it runs ``msg_id``'s code."""
    while True:
        msg = await kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            return


async def answers(kc: Any) -> bool:
    """Whether a kernel_info_request is answered within a second."""
    msg_id = kc.kernel_info()
    try:
        while True:
            reply = await kc.get_shell_msg(timeout=1)
            if reply["parent_header"].get("msg_id") == msg_id:
                return True
    except Exception:  # queue.Empty: no answer (yet)
        return False


async def dead(km: AsyncKernelManager) -> bool:
    return not await km.is_alive()


def idle_worker(conn: Connection) -> bool:
    """Whether the worker runs no task (its GPUs are free)."""
    (worker,) = conn.workers()
    return not worker.running_tasks
