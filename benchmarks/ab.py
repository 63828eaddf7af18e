"""A/B of two checkouts under the same load: warm ``.run`` calls or session cells.

Starts two ``LocalCluster``s at once, each control plane and worker importing a
different checkout (``PYTHONPATH``), and alternates the calls between them (the
order flips every call), so both see the same load on a shared machine, where
two runs a minute apart differ 2x. The client is this process's gpulayer for
both. Prints wall-clock p50/p90/p99 and CPU per call (``psutil``) of each
control plane, worker and runner or kernel; writes nothing, asserts nothing.

    .venv/bin/python benchmarks/ab.py --base /path/to/main --head . --calls 500
    .venv/bin/python benchmarks/ab.py --base /path/to/main --head . --cells
    .venv/bin/python benchmarks/ab.py --base /path/to/main --head . --prints

``--prints`` times a session cell's first output instead of its round trip: from
``print(time.time())`` in the kernel to the text arriving here (as ``cells.py``).
``--block 20`` makes 20 calls in a row on one checkout before the other's turn: a
call then meets what the one before it left on the same control plane (a commit
after its answer), as calls from one notebook do.
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
from gpulayer.client import cells


def cpu_of(cluster: LocalCluster) -> tuple[float, float, float]:
    """CPU seconds of the control plane, the worker and the worker's children."""
    worker_pid = cluster.worker_pid(cluster.workers[0])
    assert cluster.server_pid is not None and worker_pid is not None
    worker = psutil.Process(worker_pid)
    procs = [psutil.Process(cluster.server_pid), worker, *worker.children(recursive=True)]
    seconds = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            seconds.append(t.user + t.system)
            continue
        seconds.append(0.0)
    return seconds[0], seconds[1], sum(seconds[2:])


PRINT = "import time; print(repr(time.time()))"


def caller(cluster: LocalCluster, use_cells: bool, prints: bool) -> Callable[[int], float | None]:
    """One warm call on ``cluster``: ``.run`` or a cell in a running session; with
    ``prints``, a printing cell, answering its first output's latency (seconds)."""
    conn = cluster.connection()
    if use_cells or prints:
        cells.ensure_session(conn, "ab")
        deadline = time.monotonic() + 60
        while conn.session("ab").state != "running" and time.monotonic() < deadline:
            time.sleep(0.05)

        def cell(i: int) -> float | None:
            run = cells.submit(conn, PRINT if prints else "a = 1", session="ab")
            first = None
            for msg in run.messages():
                if prints and first is None and msg.msg_type == "stream":
                    first = time.time() - float(msg.content["text"])
            return first

        return cell
    f = gl.remote(lambda x: x + 1, connection=conn)

    def call(i: int) -> float | None:
        assert f.run(i) == i + 1
        return None

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout A (e.g. main)")
    parser.add_argument("--head", type=Path, required=True, help="checkout B (e.g. a branch)")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--cells", action="store_true", help="warm session cells, not .run")
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        help="calls in a row on one checkout before the other's turn (default 1): with"
        " more, each call meets what the one before it left on its control plane",
    )
    parser.add_argument(
        "--prints", action="store_true", help="a session cell's first output, not a round trip"
    )
    args = parser.parse_args()
    roots = {"base": args.base.resolve(), "head": args.head.resolve()}
    with contextlib.ExitStack() as stack:
        clusters = {}
        for name, root in roots.items():
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"gl-ab-{name}-"))
            cluster = LocalCluster(tmp, workers=1, slots=2, env={"PYTHONPATH": str(root)})
            clusters[name] = stack.enter_context(cluster)
        calls = {name: caller(c, args.cells, args.prints) for name, c in clusters.items()}
        for i in range(args.warmup):
            for call in calls.values():
                call(i)
        before = {name: cpu_of(c) for name, c in clusters.items()}
        walls: dict[str, list[float]] = {name: [] for name in calls}
        block = max(1, args.block)
        for b in range(0, args.calls, block):
            for name in list(calls) if (b // block) % 2 else list(reversed(calls)):
                for i in range(b, min(b + block, args.calls)):
                    t = time.perf_counter()
                    first = calls[name](i)
                    walls[name].append(time.perf_counter() - t if first is None else first)
        after = {name: cpu_of(c) for name, c in clusters.items()}
    what = "first outputs" if args.prints else "cells" if args.cells else ".run calls"
    print(f"{args.calls} {what} each, load {os.getloadavg()[0]:.1f}")
    for name, w in walls.items():
        w.sort()
        cpu = [(b - a) / args.calls * 1000 for a, b in zip(before[name], after[name], strict=True)]
        print(
            f"{name} ({roots[name]}): p50 {statistics.median(w) * 1000:.2f}"
            f" p90 {w[int(0.9 * len(w))] * 1000:.2f} p99 {w[int(0.99 * len(w))] * 1000:.2f} ms;"
            f" CPU per call: control plane {cpu[0]:.2f}, worker {cpu[1]:.2f},"
            f" runner/kernel {cpu[2]:.2f} ms"
        )


if __name__ == "__main__":
    main()
