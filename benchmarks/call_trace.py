"""Where a warm ``.run`` spends its time, stage by stage, across the processes.

Starts a ``LocalCluster`` whose control plane and worker load a ``sitecustomize``
(on their ``PYTHONPATH``, as ``loop_turns.py`` does) that timestamps, with the
system's monotonic clock (one clock for every process):

- every socket read and write (``socket.socket`` methods: tornado's and asyncio's
  transports use them) and every ``os.read``/``os.write`` (the worker's pipes to
  its runner);
- the entry of a few methods that mark where a call is: the submit
  (``Jobs.submit_once``), the assignment taken on the worker (``Pipeline.take``)
  and the completion (``Tasks.complete``).

Then it makes ``--calls`` warm calls one at a time and cuts each into stages, from
the client's start to its end, and prints the median of each::

    .venv/bin/python benchmarks/call_trace.py --calls 1000

A stage that ends at a read includes the wake-up of the process that reads. The
wrappers cost a few microseconds each, so the total is a little above a plain
call's. It prints and writes nothing else; it never asserts a time.
"""

import argparse
import collections
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from call_cpu import load_in_cluster, warm_call  # a script beside this one

from gpulayer.cli.cluster import LocalCluster

_SITECUSTOMIZE = """
import os
if os.environ.get("GL_CALL_TRACE"):
    import functools, inspect, signal, socket, sys, threading, time

    _events = []
    _now = time.monotonic_ns

    def _io(orig, name):
        def traced(*args, **kwargs):
            got = orig(*args, **kwargs)
            _events.append((_now(), name))
            return got
        return traced

    for _name in ("send", "sendall", "recv", "recv_into"):
        setattr(socket.socket, _name, _io(getattr(socket.socket, _name), "sock." + _name))
    os.read = _io(os.read, "os.read")
    os.write = _io(os.write, "os.write")

    _MARKS = [
        ("jupyter_ext.jobs", "Jobs", "submit_once"),
        ("jupyter_ext.tasks", "Tasks", "complete"),
        ("gpulayer.worker.pipeline", "Pipeline", "take"),
    ]

    def _marked(f, label):
        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def marked(*args, **kwargs):
                _events.append((_now(), label))
                return await f(*args, **kwargs)
        else:
            @functools.wraps(f)
            def marked(*args, **kwargs):
                _events.append((_now(), label))
                return f(*args, **kwargs)
        return marked

    def _mark_when_imported():
        left = list(_MARKS)
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for mod, cls, meth in list(left):
                owner = getattr(sys.modules.get(mod), cls, None)
                if owner is not None:
                    setattr(owner, meth, _marked(getattr(owner, meth), f"{cls}.{meth}"))
                    left.remove((mod, cls, meth))
            time.sleep(0.01)

    def _dump(*_):
        with open(os.path.join(os.environ["GL_CALL_TRACE"], str(os.getpid())), "w") as f:
            for t, name in _events:
                f.write(f"{t} {name}\\n")
        _events.clear()

    threading.Thread(target=_mark_when_imported, daemon=True).start()
    signal.signal(signal.SIGUSR1, _dump)
    signal.signal(signal.SIGUSR2, lambda *_: _events.clear())
"""

#: The stages of one call, each ending where the next begins.
STAGES = [
    "client: pack and send; the control plane wakes and reads it",
    "control plane: the submit, its commit, the push sent",
    "worker wakes and reads the push",
    "worker: take, prepare, hand to the runner",
    "runner wakes, calls, answers; the worker reads it",
    "worker: the completion, sent",
    "control plane wakes and reads it",
    "control plane: the completion, the answer sent",
    "client wakes, reads the answer and the value",
]


def _load(path: Path) -> list[tuple[int, str]]:
    out = []
    for line in path.read_text().splitlines():
        t, name = line.split(" ", 1)
        out.append((int(t), name))
    return out


def _first(events: list[tuple[int, str]], name: str, after: int, before: int) -> int | None:
    for t, n in events:
        if after <= t <= before and n == name:
            return t
    return None


def _last(events: list[tuple[int, str]], name: str, after: int, before: int) -> int | None:
    found = None
    for t, n in events:
        if after <= t <= before and n == name:
            found = t
    return found


def stages_of(
    cp: list[tuple[int, str]], w: list[tuple[int, str]], start: int, end: int
) -> list[int] | None:
    """The stage boundaries of the call made from ``start`` to ``end`` (None when
    its events are not all there, e.g. a heartbeat in the way)."""
    submit = _first(cp, "Jobs.submit_once", start, end)
    if submit is None:
        return None
    t1 = _last(cp, "sock.recv_into", start, submit)  # the submit frame read
    taken = _first(w, "Pipeline.take", submit, end)
    if t1 is None or taken is None:
        return None
    t3 = _last(w, "sock.recv", submit, taken)  # the push read
    t2 = _last(cp, "sock.send", submit, t3 or end)  # the push sent
    t4 = _first(w, "os.write", taken, end)
    t5 = _first(w, "os.read", t4 or end, end)
    t6 = _first(w, "sock.send", t5 or end, end)
    complete = _first(cp, "Tasks.complete", t6 or end, end)
    t7 = _last(cp, "sock.recv_into", t6 or end, complete or end)
    t8 = _first(cp, "sock.send", complete or end, end)
    marks = [start, t1, t2, t3, t4, t5, t6, t7, t8, end]
    if None in marks:
        return None
    times = [m for m in marks if m is not None]
    return times if times == sorted(times) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gl-trace-") as tmp:
        out = load_in_cluster(Path(tmp), _SITECUSTOMIZE, "GL_CALL_TRACE")
        with (
            LocalCluster(Path(tmp, "cluster"), workers=1, slots=2) as cluster,
            cluster.connection() as conn,
        ):
            call = warm_call(conn, cells=False, session="trace")
            for i in range(args.warmup):
                call(i)
            worker = cluster.worker_pid(cluster.workers[0])
            assert cluster.server_pid is not None and worker is not None
            pids = {"cp": cluster.server_pid, "w": worker}
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR2)
            calls = []
            for i in range(args.calls):
                start = time.monotonic_ns()
                call(i)
                calls.append((start, time.monotonic_ns()))
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                (out / str(p)).exists() for p in pids.values()
            ):
                time.sleep(0.05)
        cp, w = _load(out / str(pids["cp"])), _load(out / str(pids["w"]))
    cut = [s for s in (stages_of(cp, w, start, end) for start, end in calls) if s]
    if not cut:
        seen = collections.Counter(n for _, n in cp + w)
        sys.exit(f"no call could be cut into its stages; events: {dict(seen)}")
    spans = [[(b - a) / 1000 for a, b in itertools.pairwise(s)] for s in cut]
    totals = [(s[-1] - s[0]) / 1000 for s in cut]
    print(f"{len(cut)} of {args.calls} warm .run calls cut into stages (median, us)")
    for i, name in enumerate(STAGES):
        print(f"  {statistics.median(sp[i] for sp in spans):8.1f}  {name}")
    print(f"  {statistics.median(totals):8.1f}  the call, start to end")


if __name__ == "__main__":
    main()
