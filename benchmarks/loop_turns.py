"""Event-loop callbacks per warm call, per process: the turns of Python a call costs.

Every callback an asyncio loop runs (a task's step, a protocol's ``data_received``,
a future's done callback) is a turn of Python on a cache another process just
had. This script counts them in the control plane and the worker while
``--calls`` warm ``.run`` calls (or, with ``--cells``, session cells) run one at
a time, and prints them per call, grouped by what ran (a task's coroutine, or the
callback's name)::

    .venv/bin/python benchmarks/loop_turns.py --calls 1000
    .venv/bin/python benchmarks/loop_turns.py --calls 300 --cells

How: the cluster's processes start with a ``sitecustomize`` of this script's on
their ``PYTHONPATH`` (it shadows any other ``sitecustomize`` for them), which
wraps ``asyncio.events.Handle._run`` with a counter and writes the counts to a
file on ``SIGUSR1``. The counting costs every callback a little: read the counts,
not the timings. It prints and writes nothing else; it never asserts a time.
"""

import argparse
import collections
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from call_cpu import load_in_cluster, warm_call  # a script beside this one

from gpulayer.cli.cluster import LocalCluster

#: The counter each process of the cluster loads (``GL_LOOP_TURNS`` names the folder
#: its counts go to).
_SITECUSTOMIZE = """
import os
if os.environ.get("GL_LOOP_TURNS"):
    import asyncio.events, collections, signal

    _counts = collections.Counter()
    _run = asyncio.events.Handle._run

    def _name(cb):
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):  # a task's step, or its wake-up
            coro = owner.get_coro()
            return "task " + getattr(coro, "__qualname__", "?")
        return getattr(cb, "__qualname__", type(cb).__name__)

    def _counted(self):
        _counts[_name(self._callback)] += 1
        return _run(self)

    def _dump(*_):
        path = os.path.join(os.environ["GL_LOOP_TURNS"], str(os.getpid()))
        with open(path, "w") as f:
            for name, n in _counts.items():
                f.write(f"{n}\\t{name}\\n")
        _counts.clear()

    asyncio.events.Handle._run = _counted
    signal.signal(signal.SIGUSR1, _dump)
"""


def _read(folder: Path, pid: int, deadline: float) -> collections.Counter[str]:
    path = folder / str(pid)
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        n, name = line.split("\t", 1)
        counts[name] += int(n)
    path.unlink()
    return counts


def _snapshot(folder: Path, pids: dict[str, int]) -> dict[str, collections.Counter[str]]:
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    return {name: _read(folder, pid, deadline) for name, pid in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--cells", action="store_true", help="warm session cells, not .run")
    parser.add_argument("--top", type=int, default=12, help="rows printed per process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gl-turns-") as tmp:
        counts = load_in_cluster(Path(tmp), _SITECUSTOMIZE, "GL_LOOP_TURNS")
        with (
            LocalCluster(Path(tmp, "cluster"), workers=1, slots=2) as cluster,
            cluster.connection() as conn,
        ):
            call = warm_call(conn, cells=args.cells, session="turns")
            for i in range(args.warmup):
                call(i)
            worker = cluster.worker_pid(cluster.workers[0])
            assert cluster.server_pid is not None and worker is not None
            pids = {"control plane": cluster.server_pid, "worker": worker}
            _snapshot(counts, pids)  # from here on
            for i in range(args.calls):
                call(i)
            got = _snapshot(counts, pids)
            if args.cells:
                conn.end_session("turns")
    what = "session cells" if args.cells else "warm .run calls"
    print(f"{args.calls} {what}: event-loop callbacks per call")
    for name, counted in got.items():
        total = sum(counted.values()) / args.calls
        print(f"\n{name}: {total:.2f}")
        for label, n in counted.most_common(args.top):
            print(f"  {n / args.calls:6.2f}  {label}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
