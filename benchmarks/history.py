"""A warm ``.run`` with a long history: the round trip with ``--jobs`` finished
function jobs in the store, against the same call on an empty store, in one run;
and the listing of the newest finished jobs that the sidebar and ``gpulayer jobs``
make.

A control plane is never cleaned up by default (retention is off), and every
``.run`` is a job, so a store that has served a notebook for a while holds
100,000 jobs and their tasks. The history is made by running one real call,
then copying its job, task, events and result ``--jobs`` times in SQL (with new
ids), before the control plane starts again on that data dir.

Each measurement runs in a fresh interpreter (``--child``): a ``LocalCluster``
with one worker on a copy of the data dir, ``--warmup`` calls, then ``--calls``
calls one at a time. With ``--baseline TREE`` (``git archive BASE | tar -x -C
TREE``) the same runs are made with the gpulayer in ``TREE``; the store is then
made by the baseline (an older schema is migrated by the newer tree, not the
other way round). It measures and reports; it never asserts::

    .venv/bin/python benchmarks/history.py [--jobs 100000] [--baseline /tmp/base]

Results go to ``benchmarks/results/history.json`` and ``history.md``.
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from functions import compile_tree, write_results  # noqa: E402  (a script beside this one)

DEFAULT_OUT = HERE / "results" / "history.json"
#: ``GET jobs?state=succeeded&limit=50`` (the newest 50 finished jobs, as the
#: sidebar and ``gpulayer jobs`` ask) this many times after the calls.
LISTINGS = 20


def _child(data_dir: Path, calls: int, warmup: int) -> None:
    import gpulayer as gl
    from gpulayer.cli.cluster import LocalCluster

    with LocalCluster(data_dir, workers=1, slots=1) as cluster, cluster.connection() as conn:
        f = gl.remote(lambda x: x + 1, connection=conn)
        for i in range(warmup):
            f.run(i)
        times = []
        for i in range(calls):
            t = time.perf_counter()
            if f.run(i) != i + 1:
                raise RuntimeError("wrong answer")
            times.append(time.perf_counter() - t)
        listing = []
        for _ in range(LISTINGS):
            t = time.perf_counter()
            conn.jobs(state="succeeded", limit=50)
            listing.append(time.perf_counter() - t)
    print("RESULT " + json.dumps({"run": times, "listing": listing}))


def _spawn(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONWARNINGS="ignore")
    argv = [sys.executable, str(HERE / "history.py"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, check=False)


def _copies(conn: sqlite3.Connection, table: str, renamed: dict[str, str]) -> str:
    """``INSERT INTO table (...) SELECT ...`` that copies one job's rows with the
    columns in ``renamed`` set from parameters (``:name``) and ``seq`` left to SQLite."""
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != "seq"]
    values = [f":{renamed[c]}" if c in renamed else c for c in cols]
    key = "id" if table == "jobs" else "job_id"
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(values)}"
        f" FROM {table} WHERE {key} = :src_job"
    )


def make_history(tree: Path, data_dir: Path, jobs: int) -> None:
    """Run one call on ``data_dir`` with ``tree``, then copy its job ``jobs - 1`` times."""
    done = _spawn(tree, "--child", str(data_dir), "--calls", "1", "--warmup", "0")
    if done.returncode != 0:
        raise RuntimeError(f"the first call failed: {done.stderr[-2000:]}")
    with sqlite3.connect(data_dir / "gpulayer.db") as conn:
        (src_job,) = conn.execute(
            "SELECT job_id FROM tasks WHERE state = 'succeeded' LIMIT 1"
        ).fetchone()
        statements = [
            _copies(conn, "jobs", {"id": "job"}),
            _copies(conn, "tasks", {"id": "task", "job_id": "job"}),
            _copies(conn, "events", {"job_id": "job", "task_id": "task"}),
            _copies(conn, "results", {"job_id": "job", "task_id": "task"}),
        ]
        for _ in range(jobs - 1):  # the rows of one copy share its new ids
            ids = {"job": uuid.uuid4().hex, "task": uuid.uuid4().hex, "src_job": src_job}
            for sql in statements:
                conn.execute(sql, ids)
        count = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    print(f"history: {count} tasks in {data_dir}", file=sys.stderr)


def summary(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in times)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2),
        "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline", type=Path, metavar="TREE")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    if args.child is not None:
        _child(args.child, args.calls, args.warmup)
        return 0
    trees = {"this tree": HERE.parent}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    for tree in trees.values():
        compile_tree(tree)
    oldest = trees.get("baseline", HERE.parent)
    samples: dict[str, list[float]] = {}
    listings: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="gl-history-") as tmp:
        empty, full = Path(tmp, "empty"), Path(tmp, "full")
        make_history(oldest, empty, 1)
        make_history(oldest, full, args.jobs)
        for _ in range(args.rounds):
            for name, tree in trees.items():
                for label, src in (("empty store", empty), (f"{args.jobs} jobs", full)):
                    run_dir = Path(tmp, "run")
                    shutil.rmtree(run_dir, ignore_errors=True)
                    shutil.copytree(src, run_dir)
                    done = _spawn(tree, "--child", str(run_dir), "--calls", str(args.calls),
                                  "--warmup", str(args.warmup))  # fmt: skip
                    line = next(
                        (x for x in done.stdout.splitlines() if x.startswith("RESULT ")), ""
                    )
                    if not line:
                        raise RuntimeError(f"{name}, {label}: {done.stderr[-2000:]}")
                    got = json.loads(line[7:])
                    samples.setdefault(f"{name}, {label}", []).extend(got["run"])
                    listings.setdefault(f"{name}, {label}", []).extend(got["listing"])
                    print(f"{name}, {label}: done", file=sys.stderr)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
        "load": os.getloadavg()[0], "jobs": args.jobs, "calls": args.calls,
        "rounds": args.rounds, "runs": {k: summary(v) for k, v in samples.items()},
        "listing": {k: summary(v) for k, v in listings.items()},
    }  # fmt: skip
    lines = [
        "# A warm `.run` with a long history",
        "",
        f"`benchmarks/history.py --jobs {args.jobs}` on {result['cpus']} CPUs"
        f" (load {result['load']:.1f}, {result['date']}): {args.rounds} rounds of"
        f" {args.calls} calls after {args.warmup} warm-up calls, each in a fresh interpreter.",
        "",
        "| tree, store | `.run` p50 (ms) | p90 (ms) | p99 (ms) | newest 50 succeeded p50 (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in result["runs"].items():
        listed = result["listing"][name]["p50_ms"]
        lines.append(f"| {name} | {s['p50_ms']} | {s['p90_ms']} | {s['p99_ms']} | {listed} |")
    write_results(args.out, result, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
