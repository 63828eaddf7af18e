"""``%%gpulayer`` end to end: notebooks executed by nbclient in a real local kernel
that loads the extension, against a live control plane and a real worker whose
cells run in real remote ipykernel kernels."""

import base64
import os
import signal
import time

import pytest

from gpulayer import contracts
from gpulayer.cells import strip_ansi

from ..support import until
from .conftest import kernel_env, notebook, outputs, run, stdout

# A 1x1 PNG: what any figure or image display relays.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e2215bb80000000049454e44ae426082"
    )
).decode()


@pytest.fixture(autouse=True)
def no_sessions_left(conn):
    """Sessions hold worker slots: end what a test started."""
    yield
    for s in conn.sessions():
        conn.end_session(s.name)
    until(lambda: not conn.sessions() and not conn.jobs(state="running"), what="sessions to end")


def test_rich_output_errors_sessions_and_push_pull(cluster, tmp_path):
    nb = notebook(
        "%load_ext gpulayer",
        # 1: stdout in order, stderr, the remote GPU reservation as the cell's value
        "%%gpulayer --gpus 1\nimport os, sys\nfor i in range(5):\n    print('line', i)\n"
        "print('to stderr', file=sys.stderr)\nos.environ['CUDA_VISIBLE_DEVICES']",
        # 2: an image and HTML, as display_data
        f"%%gpulayer\nimport base64\nfrom IPython.display import HTML, Image, display\n"
        f"display(Image(data=base64.b64decode('{PNG}')))\ndisplay(HTML('<b>bold</b>'))",
        # 3: a remote exception
        "%%gpulayer\ndef inner():\n    return 1 / 0\ninner()",
        # 4, 5: a session keeps a variable across cells
        "%%gpulayer --session keep --gpus 1\nx = 41",
        "%%gpulayer --session keep\nx + 1",
        # 6-8: push a numpy array and a dict, pull results back
        "import numpy as np\na = np.arange(5)\nd = {'k': 1}",
        "%%gpulayer --session keep --push a,d --pull b,e\nb = a * 2\ne = dict(d, z=2)",
        "print(type(b).__name__, b.tolist(), e)",
        # 9: line magics
        "%gpulayer sessions",
        "%gpulayer end keep",
        "%%gpulayer --session keep\nx",  # 11: a new kernel under the old name
        # 12-14: the session kernel's history is kept in memory only (`_`, `In`
        # work; no history file: each cell written to disk cost ~0.7 ms)
        "%%gpulayer --session keep\n40 + 1",
        "%%gpulayer --session keep\n_ + 1",
        "%%gpulayer --session keep\n(get_ipython().history_manager.hist_file.exists(), In[-2])",
        # 15: output written at the very end of a cell, unflushed, all arrives although
        # the kernel no longer sleeps 0.5 ms before its reply (ADR 0142)
        "%%gpulayer --session keep\nimport sys\nfor i in range(300):\n    print(i, end=' ')\n"
        "sys.stderr.write('last')\nget_ipython().kernel._execute_sleep",
    )
    run(nb, kernel_env(cluster, tmp_path))
    cells = nb.cells
    assert stdout(cells[1]) == "".join(f"line {i}\n" for i in range(5))
    assert [o.text for o in outputs(cells[1], "stream") if o.name == "stderr"] == ["to stderr\n"]
    (result,) = outputs(cells[1], "execute_result")
    assert result.data["text/plain"] in ("'0'", "'1'")  # one of the two simulated GPUs

    shown = outputs(cells[2], "display_data")
    assert [sorted(o.data) for o in shown] == [["image/png", "text/plain"],
                                               ["text/html", "text/plain"]]  # fmt: skip
    assert shown[0].data["image/png"].strip() == PNG
    assert shown[1].data["text/html"] == "<b>bold</b>"

    (err,) = outputs(cells[3], "error")
    text = strip_ansi("\n".join(err.traceback))
    assert "ZeroDivisionError" in text and "inner()" in text and "1 / 0" in text
    assert "on worker local-1" in err.traceback[-1] and "raised in job" in err.traceback[-1]

    assert not outputs(cells[4], "error")
    assert outputs(cells[5], "execute_result")[0].data["text/plain"] == "42"
    assert not outputs(cells[7], "error"), cells[7].outputs
    assert stdout(cells[8]) == "ndarray [0, 2, 4, 6, 8] {'k': 1, 'z': 2}\n"
    assert "keep" in stdout(cells[9]) and "running" in stdout(cells[9])
    assert stdout(cells[10]) == "session keep ended\n"
    (err,) = outputs(cells[11], "error")
    assert "NameError" in strip_ansi("\n".join(err.traceback))
    assert outputs(cells[13], "execute_result")[0].data["text/plain"] == "42"
    assert outputs(cells[14], "execute_result")[0].data["text/plain"] == "(False, '_ + 1')"
    assert stdout(cells[15]) == "".join(f"{i} " for i in range(300))
    assert [o.text for o in outputs(cells[15], "stream") if o.name == "stderr"] == ["last"]
    assert outputs(cells[15], "execute_result")[0].data["text/plain"] == "0.0"


def test_interrupt_stops_a_busy_cell_and_the_session_stays_usable(cluster, conn, tmp_path):
    nb = notebook(
        "%load_ext gpulayer",
        "%%gpulayer --session spin\ncount = 0",
        "%%gpulayer --session spin\nprint('spinning', flush=True)\nwhile True:\n    count += 1",
        "%%gpulayer --session spin\nprint(count > 0)",
    )
    timings = {}

    def interrupt(client, index):
        if index != 2:
            return
        # The remote loop runs and this kernel's magic relays its output: interrupt now.
        until(lambda: "spinning" in stdout(client.nb.cells[index]), what="the busy cell to spin")
        timings["sent"] = time.monotonic()
        os.kill(client.km.provisioner.process.pid, signal.SIGINT)  # the stop button

    run(nb, kernel_env(cluster, tmp_path), during=interrupt)
    busy = nb.cells[2]
    (err,) = outputs(busy, "error")
    assert err.ename == "KeyboardInterrupt"
    cell_jobs = [j for j in conn.jobs(limit=10) if j.spec.kind == "cell"]
    spun = next(j for j in cell_jobs if j.spec.cell and "while True" in j.spec.cell.source)
    assert spun.state == contracts.JobState.cancelled
    assert spun.ended_at is not None
    assert spun.ended_at.timestamp() - (time.time() - (time.monotonic() - timings["sent"])) < 5
    assert stdout(nb.cells[3]) == "True\n"


@pytest.mark.parametrize("source", ["import os\nos._exit(3)"])
def test_a_dead_kernel_is_a_clear_error(cluster, conn, tmp_path, source):
    nb = notebook("%load_ext gpulayer", f"%%gpulayer\n{source}")
    run(nb, kernel_env(cluster, tmp_path))
    (err,) = outputs(nb.cells[1], "error")
    assert "the remote kernel died (exit code 3)" in "\n".join(err.traceback)
