"""Bandwidth: a 200 MiB workdir from the laptop to a worker, and a 200 MiB artifact
back, over the laptop's link limited to 200 Mbit/s with ``tc tbf`` (both ways), all
through the transfer path (``gpulayer/transfer.py``): the bytes arrive intact, the
client, the control plane and the worker each grow by less than 64 MiB of memory
while the bytes pass, and the client shows progress."""

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator

import psutil
import pytest

from .conftest import Laptop, Plane

MIB = 1024 * 1024
SIZE_MIB = 200
RATE = "200mbit"
SECONDS_AT_RATE = SIZE_MIB * MIB * 8 / 200e6  # 8.4 s for 200 MiB at 200 Mbit/s
GROWTH_LIMIT = 64 * MIB

JOB = f"""
import hashlib, os
h = hashlib.sha256()
with open("data.bin", "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print("workdir", h.hexdigest(), flush=True)
out = hashlib.sha256()
with open(os.path.join(os.environ["GPULAYER_ARTIFACTS"], "result.bin"), "wb") as f:
    for _ in range({SIZE_MIB}):
        block = os.urandom(1 << 20)
        out.update(block)
        f.write(block)
print("artifact", out.hexdigest(), flush=True)
"""

CLIENT = """
import hashlib, json, sys, threading, time
import psutil
import gpulayer as gl
from gpulayer.notebook import progress

work, dest = sys.argv[1], sys.argv[2]
conn = gl.connect()
me = psutil.Process()
base = peak = me.memory_info().rss
done = threading.Event()

def sample():
    global peak
    while not done.wait(0.05):
        peak = max(peak, me.memory_info().rss)

threading.Thread(target=sample, daemon=True).start()
shown = progress.transfer("workdir", want=True)
calls = {"up": 0, "down": 0}

def up(moved, total):
    calls["up"] += 1
    if total is not None:  # uploading (packing reports no total)
        shown(moved, total)

started = time.monotonic()
job = gl.submit(["python", "job.py"], workdir=work, worker="w1", progress=up, connection=conn)
uploaded = time.monotonic() - started
print(json.dumps({"job": job.id}), flush=True)
job.wait(timeout=180)
shown = progress.transfer("artifact", want=True)

def down(moved, total):
    calls["down"] += 1
    shown(moved, total)

started = time.monotonic()
paths = job.download(dest, progress=down)
downloaded = time.monotonic() - started
done.set()
h = hashlib.sha256()
with open(paths[0], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(json.dumps({"state": job.state, "logs": job.logs(), "artifact": h.hexdigest(),
                  "uploaded": uploaded, "downloaded": downloaded, "calls": calls,
                  "growth": peak - base}), flush=True)
"""


class Peaks:
    """Samples the RSS of some processes (by PID) until stopped: the growth of each."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.base = {name: p.memory_info().rss for name, p in self.procs.items()}
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for name, p in self.procs.items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.peak[name] = max(self.peak[name], p.memory_info().rss)

    def growth(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return {name: self.peak[name] - self.base[name] for name in self.procs}


def python_child(pid: int, marker: str) -> int:
    """The Python process under ``pid`` (itself included) with the argument ``marker``
    (``-m jupyter_ext``, ``gpulayer join``)."""
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        argv = p.cmdline()
        if p.name() != "sh" and marker in argv:
            return p.pid
    raise AssertionError(f"no process with {marker!r} under pid {pid}")


@pytest.fixture
def limited(gl_hosts, gl_laptop: Laptop, gl_mend) -> Iterator[Laptop]:
    gl_laptop.ready()
    gl_hosts["laptop"].limit(RATE)
    yield gl_laptop


def test_a_200_mib_workdir_and_artifact_cross_a_200_mbit_link_in_bounded_memory(
    gl_hosts, gl_fleet: Plane, limited: Laptop
):
    laptop = limited.host
    work = laptop.home / "bigwork"
    outside = laptop.outside(work)
    outside.mkdir()
    (outside / "job.py").write_text(JOB)
    sent = hashlib.sha256()
    with (outside / "data.bin").open("wb") as f:
        for _ in range(SIZE_MIB):
            block = os.urandom(MIB)
            sent.update(block)
            f.write(block)
    peaks = Peaks({
        "control plane": python_child(gl_fleet.proc.pid, "jupyter_ext"),
        "worker w1": python_child(gl_fleet.workers["w1"].pid, "join"),
    })  # fmt: skip
    client = laptop.spawn(["python", "-c", CLIENT, str(work), str(laptop.home / "out")],
                          label="bandwidth", env=limited.env)  # fmt: skip
    assert client.wait(timeout=240) == 0, laptop.log("bandwidth")[-3000:]
    growth = peaks.growth()
    printed = laptop.log("bandwidth")
    got = json.loads(printed.splitlines()[-1])
    assert got["state"] == "succeeded", got
    # Correct bytes both ways.
    assert f"workdir {sent.hexdigest()}" in got["logs"], got["logs"]
    assert f"artifact {got['artifact']}" in got["logs"], got["logs"]
    # The link was the limit: 200 MiB took at least most of 8.4 s each way.
    assert got["uploaded"] > 0.8 * SECONDS_AT_RATE, got
    assert got["downloaded"] > 0.8 * SECONDS_AT_RATE, got
    # Bounded memory in every process the bytes passed through.
    growth["client"] = got["growth"]
    assert all(g < GROWTH_LIMIT for g in growth.values()), {
        k: f"{v / MIB:.1f} MiB" for k, v in growth.items()
    }
    # Progress shown: tqdm bars that reached the end, fed chunk by chunk.
    assert "workdir: 100%" in printed and "artifact: 100%" in printed, printed[-2000:]
    assert got["calls"]["up"] > 100 and got["calls"]["down"] > 100, got["calls"]
