"""Command-job benchmarks: idle latency and burst throughput of trivial jobs.

Starts a :class:`~gpulayer.cli.cluster.LocalCluster` in a temporary directory for
each worker count and measures, through the public client API only:

idle latency
    ``submit(["true"])`` → ``Job.wait()`` returning, one job at a time on an
    idle cluster, after a few warm-up jobs. Each sample is split into the submit
    round trip (the POST, which also places the job) and the server-side
    timestamps of the job and its task::

        job.created_at → task.created_at → task.started_at → job.ended_at → client
             placed           picked up         ran + reported     wait() answered

baseline
    ``subprocess.run(["true"])`` in this process, as many times, so the overhead
    can be read as a ratio over a bare process start.

burst throughput
    ``--jobs`` trivial jobs submitted as fast as possible, sequentially from one
    connection and then from ``--threads`` threads with a connection each;
    then every job is waited for. Reports the submit rate, the end-to-end rate
    (first submit to the last job's ``ended_at``) and the total time.

It measures and reports; it never asserts on wall-clock times. Run it as::

    .venv/bin/python benchmarks/commands.py --jobs 200 --samples 30

The server and worker clocks are this machine's clock, so client wall-clock
times (``time.time()``) and server timestamps can be subtracted from each other.
"""

import argparse
import cProfile
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gpulayer
from gpulayer import contracts
from gpulayer.cli.cluster import LocalCluster
from gpulayer.client import Connection, Job, submit
from gpulayer.errors import GpulayerError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "commands.json"
WARMUP_JOBS = 3
#: How long one job may take before the benchmark gives up on it (not an assertion).
JOB_TIMEOUT_SECONDS = 120.0
COMMAND = ["true"]
#: Tornado's access-log line for a 5xx answer, e.g. ``500 POST /gpulayer/api/v1/jobs (@...``.
_ACCESS_5XX = re.compile(r"\] (?P<status>5\d\d) (?P<method>[A-Z]+) (?P<path>\S+) \(")
_HEX_ID = re.compile(r"/[0-9a-f]{12}(?=/|$)")

#: The phases of one idle-latency sample, in order, with what each covers.
PHASES = {
    "submit_post": "client POST jobs round trip (includes placement)",
    "queued_to_placed": "job.created_at -> task.created_at (scheduler placement)",
    "placed_to_started": "task.created_at -> task.started_at (worker acquire pickup)",
    "started_to_ended": "task.started_at -> job.ended_at (spawn, run, logs, complete)",
    "ended_to_client": "job.ended_at -> Job.wait() returned (wake-up + GET answer)",
    "total": "submit() called -> Job.wait() returned",
}


# ---------------------------------------------------------------- statistics


def summarize(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/min/max/mean of seconds, in milliseconds."""
    ms = sorted(v * 1000.0 for v in values_s)
    # quantiles() needs two points; one sample is every percentile of itself.
    q = ms * 99 if len(ms) == 1 else statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "n": len(ms),
        "p50": q[49],
        "p90": q[89],
        "p99": q[98],
        "min": ms[0],
        "max": ms[-1],
        "mean": statistics.fmean(ms),
    }


def _ts(value: dt.datetime | None) -> float:
    if value is None:
        raise RuntimeError("a finished job lacks a timestamp")
    return value.timestamp()


# --------------------------------------------------------------- benchmarks


def baseline(samples: int) -> dict[str, Any]:
    """Time ``subprocess.run(["true"])`` ``samples`` times (after one warm-up)."""
    subprocess.run(COMMAND, check=True)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        subprocess.run(COMMAND, check=True)
        times.append(time.perf_counter() - t0)
    return {"command": COMMAND, "ms": summarize(times)}


def one_sample(conn: Connection) -> dict[str, float]:
    """Submit one ``true`` job, wait for it, and split its latency into phases (s)."""
    wall0 = time.time()
    t0 = time.perf_counter()
    job = submit(COMMAND, connection=conn)
    t1 = time.perf_counter()
    job.wait(timeout=JOB_TIMEOUT_SECONDS)
    t2 = time.perf_counter()
    info = job.info
    if info.state != contracts.JobState.succeeded:
        raise RuntimeError(f"job {info.id} ended {info.state}: {info.reason}")
    task = info.tasks[-1]
    created, placed = _ts(info.created_at), _ts(task.created_at)
    started, ended = _ts(task.started_at), _ts(info.ended_at)
    return {
        "submit_post": t1 - t0,
        "queued_to_placed": placed - created,
        "placed_to_started": started - placed,
        "started_to_ended": ended - started,
        "ended_to_client": (wall0 + (t2 - t0)) - ended,
        "total": t2 - t0,
    }


def idle_latency(conn: Connection, samples: int, profile_to: Path | None = None) -> dict[str, Any]:
    """Sequential ``true`` jobs on an idle cluster; per-phase statistics in ms.

    With ``profile_to``, the measured loop runs under cProfile (client side only)
    and the stats are dumped there; the numbers then include profiling overhead.
    """
    for _ in range(WARMUP_JOBS):
        submit(COMMAND, connection=conn).wait(timeout=JOB_TIMEOUT_SECONDS)
    profiler = cProfile.Profile() if profile_to is not None else None
    rows = []
    if profiler is not None:
        profiler.enable()
    try:
        for _ in range(samples):
            rows.append(one_sample(conn))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile_to)
    return {
        "warmup_jobs": WARMUP_JOBS,
        "phases": PHASES,
        "ms": {name: summarize([r[name] for r in rows]) for name in PHASES},
        "samples_ms": [{k: round(v * 1000.0, 3) for k, v in r.items()} for r in rows],
    }


def _wait_all(conn: Connection, jobs: Sequence[Job]) -> dict[str, int]:
    """Wait for every job (through ``conn``); count them by final state."""
    states: dict[str, int] = {}
    for job in jobs:
        info = conn.wait(job.id, timeout=JOB_TIMEOUT_SECONDS)
        job.info = info
        states[str(info.state)] = states.get(str(info.state), 0) + 1
    return states


class _Submitter:
    """Submits ``true`` jobs through one connection; a refused submit is counted,
    not raised, so that a burst always finishes and reports how many failed."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.jobs: list[Job] = []
        self.errors: list[str] = []

    def run(self, count: int) -> None:
        for _ in range(count):
            try:
                self.jobs.append(submit(COMMAND, connection=self.conn))
            except GpulayerError as e:
                self.errors.append(f"{type(e).__name__}: {e}")


def _burst_result(
    submitters: Sequence[_Submitter],
    conn: Connection,
    wall0: float,
    t0: float,
    t_submitted: float,
) -> dict[str, Any]:
    """Wait for the burst's jobs, then its rates (over the jobs that were accepted)."""
    jobs = [job for s in submitters for job in s.jobs]
    errors = [e for s in submitters for e in s.errors]
    states = _wait_all(conn, jobs)
    total_s = time.perf_counter() - t0
    submit_s = t_submitted - t0
    ended = [_ts(j.info.ended_at) for j in jobs if j.info.ended_at is not None]
    end_to_end_s = max(ended) - wall0 if ended else float("nan")
    n = len(jobs)
    return {
        "jobs": n,
        "states": states,
        "submit_errors": len(errors),
        "first_submit_error": errors[0] if errors else None,
        "submit_s": submit_s,
        "submit_rate_per_s": (n + len(errors)) / submit_s,
        "end_to_end_s": end_to_end_s,
        "end_to_end_rate_per_s": n / end_to_end_s,
        "total_s": total_s,
    }


def burst_sequential(conn: Connection, n: int) -> dict[str, Any]:
    """Submit ``n`` jobs back to back from one connection, then wait for all."""
    submitter = _Submitter(conn)
    wall0 = time.time()
    t0 = time.perf_counter()
    submitter.run(n)
    return _burst_result([submitter], conn, wall0, t0, time.perf_counter())


def burst_threaded(cluster: LocalCluster, conn: Connection, n: int, threads: int) -> dict[str, Any]:
    """Submit ``n`` jobs from ``threads`` threads (one connection each), then wait."""
    submitters = [_Submitter(cluster.connection()) for _ in range(threads)]
    try:
        for s in submitters:  # open each TCP connection before the clock starts
            s.conn.health()
        shares = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
        start = threading.Barrier(threads + 1)

        def work(s: _Submitter, count: int) -> None:
            start.wait()
            s.run(count)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(work, s, k) for s, k in zip(submitters, shares, strict=True)]
            start.wait()
            wall0 = time.time()
            t0 = time.perf_counter()
            for f in futures:
                f.result()
            t_submitted = time.perf_counter()
        result = _burst_result(submitters, conn, wall0, t0, t_submitted)
    finally:
        for s in submitters:
            s.conn.close()
    result["threads"] = threads
    return result


def run_cluster(args: argparse.Namespace, workers: int, data_dir: Path) -> dict[str, Any]:
    """Start a cluster with ``workers`` workers, run every benchmark, stop it."""
    cluster = LocalCluster(data_dir, workers=workers, slots=args.slots)
    t0 = time.perf_counter()
    try:
        cluster.start()
        startup_s = time.perf_counter() - t0
        with cluster.connection() as conn:
            profile_to = None
            if args.profile is not None:
                profile_to = args.profile.with_suffix(f".w{workers}{args.profile.suffix}")
            _progress(f"[{workers} worker(s)] idle latency, {args.samples} samples")
            idle = idle_latency(conn, args.samples, profile_to)
            _progress(f"[{workers} worker(s)] burst of {args.jobs}, sequential submits")
            sequential = burst_sequential(conn, args.jobs)
            _progress(f"[{workers} worker(s)] burst of {args.jobs}, {args.threads} threads")
            threaded = burst_threaded(cluster, conn, args.jobs, args.threads)
    finally:
        cluster.stop()
    server_errors = server_5xx(cluster.log_path())
    if server_errors:
        _progress(f"[{workers} worker(s)] the control plane answered 5xx: {server_errors}")
    return {
        "workers": workers,
        "slots": args.slots,
        "cluster_start_s": startup_s,
        "idle_latency": idle,
        "burst": {"sequential": sequential, "threaded": threaded},
        "server_5xx": server_errors,
        "data_dir": str(data_dir) if args.keep else None,
    }


def server_5xx(log_file: Path) -> dict[str, int]:
    """5xx answers in a control plane log, by method and route (ids as ``{id}``).

    Workers retry 5xx answers silently, so the log is the only place they show.
    """
    counts: dict[str, int] = {}
    try:
        text = log_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return counts
    for m in _ACCESS_5XX.finditer(text):
        route = _HEX_ID.sub("/{id}", m["path"].split("?")[0])
        key = f"{m['status']} {m['method']} {route}"
        counts[key] = counts.get(key, 0) + 1
    return counts


# ------------------------------------------------------------------ output


def machine() -> dict[str, Any]:
    """Where the numbers come from."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    # Uncommitted changes to the code under test make the commit only a hint.
    dirty = bool(git("status", "--porcelain", "--", "gpulayer", "jupyter_ext"))
    return {
        "cpu_count": os.cpu_count(),
        # Other work on the machine skews every number; 1-minute load at the start.
        "load_avg_1m": os.getloadavg()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "gpulayer": gpulayer.__version__,
        "git_commit": commit or None,
        "git_dirty": dirty,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def render(result: dict[str, Any]) -> str:
    """The results as Markdown tables (what the script prints)."""
    base = result["baseline"]["ms"]
    out = [
        f"gpulayer {result['machine']['gpulayer']} ({result['machine']['git_commit']}"
        f"{', with uncommitted changes' if result['machine']['git_dirty'] else ''}), "
        f"{result['machine']['cpu_count']} CPUs (load {result['machine']['load_avg_1m']:.2f}), "
        f"Python {result['machine']['python']}, "
        f"{result['machine']['date']}",
        "",
        f"Baseline `subprocess.run(['true'])`: p50 {base['p50']:.2f} ms, "
        f"p90 {base['p90']:.2f} ms (n={base['n']})",
    ]
    for run in result["runs"]:
        idle = run["idle_latency"]["ms"]
        ratio = idle["total"]["p50"] / base["p50"]
        out += [
            "",
            f"### {run['workers']} worker(s), {run['slots']} slots: idle latency (ms), "
            f"p50 total = {ratio:.1f}x a bare process start",
            "",
            "| phase | p50 | p90 | p99 | min | max |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name in PHASES:
            s = idle[name]
            out.append(
                f"| {name} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} "
                f"| {s['min']:.1f} | {s['max']:.1f} |"
            )
        out += [
            "",
            f"### {run['workers']} worker(s): burst of {result['parameters']['jobs']} jobs",
            "",
            "| submitters | submit jobs/s | end-to-end jobs/s | total s | states |",
            "|---|---:|---:|---:|---|",
        ]
        for label, b in (
            ("1 (sequential)", run["burst"]["sequential"]),
            (f"{run['burst']['threaded']['threads']} threads", run["burst"]["threaded"]),
        ):
            states = ", ".join(f"{k} {v}" for k, v in sorted(b["states"].items()))
            if b["submit_errors"]:
                states += f", submit refused {b['submit_errors']}"
            out.append(
                f"| {label} | {b['submit_rate_per_s']:.1f} | {b['end_to_end_rate_per_s']:.1f} "
                f"| {b['total_s']:.2f} | {states} |"
            )
    return "\n".join(out)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200, help="jobs per burst (default 200)")
    p.add_argument("--samples", type=int, default=30, help="idle-latency samples (default 30)")
    p.add_argument("--slots", type=int, default=4, help="slots per worker (default 4)")
    p.add_argument(
        "--workers",
        type=int,
        action="append",
        help="worker count; repeat for several runs (default: 1 and 2)",
    )
    p.add_argument("--threads", type=int, default=8, help="submit threads (default 8)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    p.add_argument(
        "--profile",
        type=Path,
        help="cProfile the client side of the idle-latency loop into PATH.w<N>.prof",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the clusters' data dirs (logs) afterwards"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks, print the tables and write the JSON results."""
    args = parse_args(argv)
    worker_counts = args.workers or [1, 2]
    result: dict[str, Any] = {
        "benchmark": "commands",
        "machine": machine(),
        "parameters": {
            "jobs": args.jobs,
            "samples": args.samples,
            "slots": args.slots,
            "workers": worker_counts,
            "threads": args.threads,
            "command": COMMAND,
        },
    }
    t0 = time.perf_counter()
    result["baseline"] = baseline(args.samples)
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    try:
        result["runs"] = [run_cluster(args, n, tmp / f"w{n}") for n in worker_counts]
    finally:
        if args.keep:
            _progress(f"cluster data kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["runtime_s"] = time.perf_counter() - t0
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
