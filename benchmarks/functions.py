"""Remote-function benchmark: gpulayer against Ray, ipyparallel and Dask, in one run.

Each system runs in its own fresh interpreter (``--system NAME`` child mode),
one after the other, on this machine, with two workers of one process each:

startup
    From starting the system (``LocalCluster`` as ``gpulayer up`` does, with 2
    local workers; ``ray.init``; ``ipp.Cluster(n=2)``; a Dask ``LocalCluster``)
    to the first result of ``f(1)``. Imports are not counted.
round trip
    ``f(x)`` with ``f = lambda x: x + 1``, one call at a time, waited for,
    ``--calls`` times after ``--warmup`` calls: gpulayer ``.run(x)``, Ray
    ``ray.get(f.remote(x))``, ipyparallel load-balanced ``view.apply_sync``,
    Dask ``client.submit(f, x, pure=False).result()``.
burst
    ``--burst`` calls at once, waited for: gpulayer ``list(f.map(...))``, Ray
    ``ray.get([f.remote(x) ...])``, ipyparallel ``view.map_sync``, Dask
    ``client.gather(client.map(...))``; reported as calls per second.

gpulayer runs twice: over the live channel (the default, docs/channel.md) and
over the HTTP long-poll fallback (``gpulayer-http``: ``GPULAYER_CHANNEL=http`` for
the client and the workers).

It prints a table and writes ``benchmarks/results/functions.json`` and ``.md``;
ratios against Ray are computed from the same run. Peers come from the
``bench`` extra (``pip install -e ".[bench]"``); a peer that is not installed
is reported as skipped. Nothing here asserts a time.

    .venv/bin/python benchmarks/functions.py
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = ("gpulayer", "gpulayer-http", "ray", "ipyparallel", "dask")


def compile_tree(root: Path) -> None:
    """Write the bytecode of gpulayer's packages in ``root``, as an installed package
    has it. Where ``PYTHONDONTWRITEBYTECODE`` is set (these sandboxes set it) an
    editable checkout is compiled again by every process at every start (~0.2 s of
    each start-up here), while the peers come from site-packages with theirs."""
    for package in ("gpulayer", "jupyter_ext"):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / package)], check=True)


def write_results(out: Path, result: dict[str, Any], text: str) -> None:
    """``result`` as ``out`` (JSON) and ``text`` as its ``.md`` beside it; print ``text``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


def plus_one(x: int) -> int:
    return x + 1


def _quantiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] * 1000

    return {
        "p50_ms": q(0.5),
        "p90_ms": q(0.9),
        "p99_ms": q(0.99),
        "mean_ms": statistics.mean(s) * 1000,
    }


def _round_trips(call, calls: int, warmup: int) -> dict[str, float]:
    for i in range(warmup):
        call(i)
    samples = []
    for i in range(calls):
        t = time.perf_counter()
        got = call(i)
        samples.append(time.perf_counter() - t)
        if got != i + 1:
            raise RuntimeError(f"wrong answer {got!r} for {i}")
    return _quantiles(samples)


def _burst(run_all, n: int) -> dict[str, float]:
    t = time.perf_counter()
    got = run_all(list(range(n)))
    seconds = time.perf_counter() - t
    if sorted(got) != [x + 1 for x in range(n)]:
        raise RuntimeError("the burst answered wrong results")
    return {"calls": n, "seconds": seconds, "calls_per_s": n / seconds}


# ------------------------------------------------------------------ systems


def bench_gpulayer(args: argparse.Namespace) -> dict[str, Any]:
    import gpulayer as gl
    from gpulayer.cli.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="gl-bench-") as tmp:
        t = time.perf_counter()
        cluster = LocalCluster(tmp, workers=2, slots=1).start()
        try:
            conn = cluster.connection()
            f = gl.remote(lambda x: x + 1, connection=conn)
            if f.run(0) != 1:
                raise RuntimeError("wrong first answer")
            startup = time.perf_counter() - t
            rt = _round_trips(f.run, args.calls, args.warmup)
            burst = _burst(lambda xs: list(f.map(xs, progress=False)), args.burst)
            channel = conn.channel_open
        finally:
            cluster.stop()
    return {"startup_s": startup, "round_trip": rt, "burst": burst, "version": gl.__version__,
            "channel": channel}  # fmt: skip


def bench_gpulayer_http(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["GPULAYER_CHANNEL"] = "http"  # this client and the workers it starts
    return bench_gpulayer(args)


def bench_ray(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        f = ray.remote(num_cpus=1)(plus_one)
        if ray.get(f.remote(0)) != 1:
            raise RuntimeError("wrong first answer")
        startup = time.perf_counter() - t
        rt = _round_trips(lambda x: ray.get(f.remote(x)), args.calls, args.warmup)
        burst = _burst(lambda xs: ray.get([f.remote(x) for x in xs]), args.burst)
    finally:
        ray.shutdown()
    return {"startup_s": startup, "round_trip": rt, "burst": burst, "version": ray.__version__}


def bench_ipyparallel(args: argparse.Namespace) -> dict[str, Any]:
    import ipyparallel as ipp

    t = time.perf_counter()
    cluster = ipp.Cluster(n=2, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(2, timeout=120)
        view = rc.load_balanced_view()
        if view.apply_sync(plus_one, 0) != 1:
            raise RuntimeError("wrong first answer")
        startup = time.perf_counter() - t
        rt = _round_trips(lambda x: view.apply_sync(plus_one, x), args.calls, args.warmup)
        burst = _burst(lambda xs: view.map_sync(plus_one, xs), args.burst)
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return {"startup_s": startup, "round_trip": rt, "burst": burst, "version": ipp.__version__}


def bench_dask(args: argparse.Namespace) -> dict[str, Any]:
    import dask
    from dask.distributed import Client, LocalCluster

    t = time.perf_counter()
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = Client(cluster)
    try:
        if client.submit(plus_one, 0, pure=False).result() != 1:
            raise RuntimeError("wrong first answer")
        startup = time.perf_counter() - t
        rt = _round_trips(
            lambda x: client.submit(plus_one, x, pure=False).result(), args.calls, args.warmup
        )
        burst = _burst(lambda xs: client.gather(client.map(plus_one, xs, pure=False)), args.burst)
    finally:
        client.close()
        cluster.close()
    return {"startup_s": startup, "round_trip": rt, "burst": burst, "version": dask.__version__}


# ------------------------------------------------------------------ driver


NOTES = """
## Latest run (issue 20 item 2: one transaction per submit, the end answered while it commits)

The table above: the final code, 300 round trips after 30 warm-up calls, a burst
of 1000, on a 2-CPU machine shared with three other engineers' test runs (load
average 3-5 during it). Two earlier runs of this branch, before its last commits,
gave gpulayer 8.1 / 15.7 / 28.6 ms (p50 / p90 / p99; load 4-5; Ray 1.9 / 4.0 /
8.1 ms) and 16.1 / 26.8 / 51.2 ms (load ~7; Ray 1.7 / 1.9 / 2.2 ms): at this load
a row moves 2x between runs, so the targets are judged on all three, and the
change itself on A/B runs in which both versions share the load.

| target | result | met? |
| --- | --- | --- |
| `.run` p50 <= Ray's p50 | 14.1 ms vs 2.0 ms (7.2x); 8.1 vs 1.9 and 16.1 vs 1.7 ms earlier | no |
| `.run` p99 <= 10 ms | 47.2 ms; 28.6 and 51.2 ms earlier | no |
| `.map` burst >= 2x Ray | 4484 calls/s vs 1525 (2.9x); 7.2x and 3.5x earlier | yes |

**A/B, same load** (`benchmarks/ab.py --base /work/main --head .`: two
`LocalCluster`s at once, one running main's control plane and worker, one this
branch's, warm `.run` calls alternated between them, so both see the same load;
the client is the same code). Three runs:

| run (load) | p50 / p90 / p99, main (ms) | this branch (ms) | control plane CPU | worker CPU |
| --- | ---: | ---: | ---: | ---: |
| 500 calls (~7) | 20.8 / 37.5 / 65.8 | 17.1 / 33.1 / 63.8 | 4.32 -> 3.80 | 2.30 -> 2.36 |
| 500 calls (~6) | 16.4 / 48.3 / 197 | 12.3 / 41.9 / 91.6 | 4.10 -> 3.38 | 2.18 -> 2.16 |
| 300 calls (~5) | 17.1 / 40.0 / 161 | 12.9 / 29.4 / 90.0 | 4.13 -> 3.37 | 2.30 -> 2.27 |
| 300, final code (~2.6) | 7.45 / 21.7 / 36.6 | 6.35 / 19.1 / 31.7 | 3.30 -> 2.83 | 1.83 -> 1.77 |

CPU is per call, main -> this branch, in ms. The first three rows are before the
last commits (the body scan, the worker's cheaper channel answers, the push
before the submit's answer); the worker barely changed; the runner takes
0.3-0.5 ms. On the quiet
machine before anyone else's tests started (load 0.05),
`benchmarks/call_cpu.py --calls 200` on main gave 5.15 ms per call (client 0.75,
control plane 2.65, worker 1.50, runner 0.25) and a wall p50 of 4.7 ms; the
control plane's CPU falls by about the same share with this branch (2.35-2.45 ms
at load 2).

What was profiled (cProfile in every process: `py-spy` cannot attach in this
sandbox, "Failed to find python version") and changed:

1. **A submit, its placement and its start were three transactions** (and the
   placement pass read the queue, the fleet and the holds again after the
   submit, the acquire the job again): a job that the pass after its submit
   would place at once (nothing queued, a free fit; a warm session's cell on its
   session's worker) is stored placed in the submit's own transaction, and
   started in it too when its worker's acquire is waiting; its assignment is
   handed to that acquire from memory (ADR 0133). Writes per warm call: 4 -> 2
   (aiosqlite `put_nowait` calls per 1000 calls: 4005 -> 2008).
2. **The caller waited for the completion's commit**: a function's end is
   answered to the caller waiting for it while the completion commits, with the
   same `Job` a read after the commit gives (ADR 0112, amended).
3. **A submit with `wait` read its new job back** (job, tasks, names, spans,
   parts) before waiting for it; it reads it once, when it ended.
4. **Fewer reads at a completion** (its job once, not three times; no session
   bookkeeping for a function) and, in the client, **the local modules listed
   once per change of `sys.modules`**, not scanned (hundreds of modules) twice
   per call.

Where a warm `.run`'s time goes now (phase times of 60 calls at load 5, from the
client's clock, the control plane's `running` event and timestamps the worker
logged around its steps; one machine, one clock): call -> the task stored
started 1.2 ms (pickling, the frame, parsing, checks, placement) -> the worker
has the assignment 1.3 ms (the commit's hand-off to the writer thread, the push,
the worker parsing it) -> the runner's answer back in the worker 3.4 ms, of which
the task folder 0.35 ms and the pipe round trip to the warm runner ~3 ms (the
runner spends 0.3 ms of CPU on it: the rest is waiting to be scheduled on a
loaded machine) -> the value in the client 1.8 ms (the completion frame, the
early answer, the client's frame). A second sample a minute later, at a load
spike, had every phase 3-5x longer.

Why `.run` is still 4-9x Ray at p50: a call is still a durable job with two
SQLite transactions handed to the writer thread, crossing four processes
(client, control plane, worker, runner), each woken per call through a
WebSocket frame or a pipe, with pydantic validation of every frame; on 2 CPUs
shared with test suites each wake-up waits for a time slice. What is left in
the control plane's profile: the three socket writes per call (answer, push,
completion answer; `send` mostly waits for the GIL after the syscall), the
commits' thread hand-offs, ~12 point reads, and parsing (`decode_json`,
including `check_storable` twice per body). Ray keeps task state in memory and
answers from a worker attached to the driver. Next steps (not done): group
commits of completions and log batches (another branch), a worker path without
a task folder for a call that writes no files (`launch.py`, another branch),
and a cheaper `check_storable` on bodies that cannot hold a bad value.

## Earlier run (the live channel, 2026-12-04)

| system | round trip p50 / p90 / p99 (ms) | burst (calls/s) |
| --- | ---: | ---: |
| gpulayer 0.1.0 | 26.47 / 42.24 / 66.07 | 4961 |
| gpulayer-http 0.1.0 | 32.92 / 50.33 / 89.47 | 9979 |
| ray 2.60.0 | 2.18 / 2.70 / 13.26 | 1040 |
| ipyparallel 9.2.0 | 4.36 / 6.72 / 16.06 | 281 |
| dask 2026.8.0 | 11.07 / 15.05 / 21.11 | 402 |

The machine was shared with seven other engineers running test suites (load
6-12 on 2 CPUs; Ray's own start-up took 20 s). CPU time of each process over 200
warm calls (`psutil`, load ~9.5), per call: over HTTP 17.2 ms (client 2.3,
control plane 8.5, worker 5.8, runner 0.7), over the channel 10.6 ms (client
1.6, control plane 5.3, worker 3.1, runner 0.7). What changed then:

1. **Three HTTP requests per call** (each parsed by tornado, each token looked up
   in the store, each long poll armed again) became frames on two open
   WebSockets (ADR 0111): control-plane CPU 12.8 -> 8.6 ms per call.
2. **Nagle**: small frames waited ~40 ms for an ACK until both ends set
   `TCP_NODELAY`.
3. **Reads handed to aiosqlite's thread**: ~20 point reads per call, each two
   context switches; they run on the event loop on a read-only WAL connection now
   (ADR 0113): 8.6 -> 5.3 ms.
4. **The worker removed each task's folder inline** (44% of the worker's
   samples in `rmdir`); it runs in a thread now.
5. **The first log line of a burst waited `log_batch_seconds`** (50 ms): after
   a quiet spell it goes at once (cells' first output).
"""


def _child(args: argparse.Namespace) -> None:
    result = globals()[f"bench_{args.system.replace('-', '_')}"](args)
    print("RESULT " + json.dumps(result), flush=True)


def _run_system(name: str, args: argparse.Namespace) -> dict[str, Any]:
    try:
        modules = {"ipyparallel": "ipyparallel", "dask": "distributed", "gpulayer-http": "gpulayer"}
        __import__(modules.get(name, name))
    except ImportError:
        return {"skipped": f"{name} is not installed (pip install -e '.[bench]')"}
    argv = [sys.executable, __file__, "--system", name, "--calls", str(args.calls),
            "--warmup", str(args.warmup), "--burst", str(args.burst)]  # fmt: skip
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def _table(results: dict[str, dict[str, Any]]) -> str:
    ray = results.get("ray", {})
    rows = ["| system | startup to first result (s) | round trip p50 / p90 / p99 (ms) |"
            " burst (calls/s) | vs Ray: p50, burst |",
            "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, r in results.items():
        if "round_trip" not in r:
            rows.append(f"| {name} | {r.get('skipped') or r.get('error')} | | | |")
            continue
        rt, burst = r["round_trip"], r["burst"]
        vs = ""
        if "round_trip" in ray:
            vs = (
                f"{rt['p50_ms'] / ray['round_trip']['p50_ms']:.2f}x,"
                f" {burst['calls_per_s'] / ray['burst']['calls_per_s']:.2f}x"
            )
        rows.append(
            f"| {name} {r.get('version', '')} | {r['startup_s']:.2f} |"
            f" {rt['p50_ms']:.2f} / {rt['p90_ms']:.2f} / {rt['p99_ms']:.2f} |"
            f" {burst['calls_per_s']:.0f} | {vs} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--only", default=",".join(SYSTEMS), help="systems to run, comma-separated")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS / "functions.json")
    args = parser.parse_args()
    if args.system:
        _child(args)
        return
    compile_tree(ROOT)
    results = {}
    for name in args.only.split(","):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = _run_system(name, args)
    table = _table(results)
    print(table)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "calls": args.calls,
        "burst": args.burst,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# Remote functions vs peers\n\n{meta['machine']}, {meta['when']}; {args.calls} round"
        f" trips after {args.warmup} warm-up calls, a burst of {args.burst} calls.\n\n"
        f"{table}\n{NOTES}"
    )


if __name__ == "__main__":
    main()
