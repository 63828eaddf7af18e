"""CPU time per warm call, per process: where a ``.run`` or a session cell spends it.

Starts a ``LocalCluster`` (one worker, one slot), warms up, then runs ``--calls``
warm calls one at a time and reads each process's CPU time (user + system,
``psutil``) before and after: this client, the control plane, the worker, and the
worker's children (the function runner, or the session's kernel). CPU time is
what a loaded machine cannot hide, unlike wall-clock latency; the wall-clock p50
is printed too, for the record.

    .venv/bin/python benchmarks/call_cpu.py --calls 200             # @gl.remote .run
    .venv/bin/python benchmarks/call_cpu.py --calls 200 --cells     # %%gpulayer --session

It prints one line per process and writes nothing; it never asserts a time.
"""

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

import gpulayer as gl
from gpulayer.cli.cluster import LocalCluster
from gpulayer.client import Connection
from gpulayer.client import cells as cells_api


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _tree(proc: psutil.Process) -> float:
    """CPU of ``proc``'s live children (runners, kernels), not counting ``proc``."""
    total = 0.0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # ended meanwhile
            total += _cpu(child)
    return total


def measure(call: Callable[[int], None], cluster: LocalCluster, calls: int) -> None:
    """Run ``call`` ``calls`` times and print CPU per call by process."""
    server = psutil.Process(cluster.server_pid)
    worker_pid = cluster.worker_pid(cluster.workers[0])
    assert worker_pid is not None
    worker = psutil.Process(worker_pid)
    me = psutil.Process()
    procs = {"client": me, "control plane": server, "worker": worker}
    before = {k: _cpu(p) for k, p in procs.items()}
    before_children = _tree(worker)
    walls = []
    for i in range(calls):
        t = time.perf_counter()
        call(i)
        walls.append(time.perf_counter() - t)
    after = {k: _cpu(p) for k, p in procs.items()}
    children = _tree(worker) - before_children
    per = {k: (after[k] - before[k]) / calls * 1000 for k in procs}
    per["runner/kernel"] = children / calls * 1000
    total = sum(per.values())
    load = psutil.getloadavg()[0]
    print(f"{calls} calls, load {load:.2f}, wall p50 {statistics.median(walls) * 1000:.2f} ms")
    print(f"CPU per call: {total:.2f} ms = " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()))


def load_in_cluster(tmp: Path, source: str, variable: str) -> Path:
    """Make the processes of a cluster started from here on load ``source`` as their
    ``sitecustomize`` (written under ``tmp``, put first on ``PYTHONPATH``, shadowing any
    other) and find in ``variable`` the folder they write to: answered, made empty."""
    site, out = Path(tmp, "site"), Path(tmp, variable.lower())
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(source)
    os.environ[variable] = str(out)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
    )
    return out


def warm_call(conn: Connection, *, cells: bool, session: str) -> Callable[[int], None]:
    """One warm call to make again and again: a ``.run`` of a trivial function, or
    with ``cells`` an ``a = 1`` cell in the session ``session`` (started here and
    waited for; end it with ``conn.end_session(session)``)."""
    if cells:
        cells_api.ensure_session(conn, session)
        deadline = time.monotonic() + 60
        while conn.session(session).state != "running" and time.monotonic() < deadline:
            time.sleep(0.05)

        def cell(i: int) -> None:
            run = cells_api.submit(conn, "a = 1", session=session)
            for _ in run.messages():
                pass
            assert run.reply is not None and run.reply.get("status") == "ok"

        return cell
    f = gl.remote(lambda x: x + 1, connection=conn)

    def call(i: int) -> None:
        assert f.run(i) == i + 1

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--cells", action="store_true", help="warm session cells, not .run")
    parser.add_argument("--repeat", type=int, default=1, help="measure this many times")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="gl-cpu-") as tmp,
        LocalCluster(tmp, workers=1, slots=2) as cluster,
        cluster.connection() as conn,
    ):
        call = warm_call(conn, cells=args.cells, session="cpu")

        for i in range(args.warmup):
            call(i)
        for _ in range(args.repeat):
            measure(call, cluster, args.calls)
        if args.cells:
            conn.end_session("cpu")


if __name__ == "__main__":
    main()
