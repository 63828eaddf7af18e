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

With ``--rounds N`` the systems run N times, one after the other in turn (the
order reversed every other round), and each figure is the median over the rounds:
a call's time here changes 2x between spells of minutes, and one run per system
can catch a peer in a fast spell and gpulayer in a slow one, or the reverse. The
paired ratio under the table compares each round's p50 with Ray's of the same
round, and takes the median of those ratios (as ``startup.py`` does for the start).

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


#: The lines around what a benchmark writes into its ``.md``: each run replaces what
#: is between them and keeps the rest of the file, where people write their notes.
RESULTS_START = "<!-- results: the benchmark replaces what is between these lines at each run -->"
RESULTS_END = "<!-- end of results: notes below are kept -->"


def merge_results(old: str | None, text: str) -> str:
    """The ``.md`` with ``text`` as its results: between the markers of ``old``, or,
    when ``old`` has none (a file written by hand, or before the markers), above all
    of it, which is kept as it was."""
    block = f"{RESULTS_START}\n{text.rstrip()}\n{RESULTS_END}\n"
    if not old:
        return block
    start, end = old.find(RESULTS_START), old.find(RESULTS_END)
    if start == -1 or end < start:
        return f"{block}\n{old}"
    return old[:start] + block + old[end + len(RESULTS_END) :].removeprefix("\n")


def write_results(out: Path, result: dict[str, Any], text: str, *, default: Any = None) -> None:
    """``result`` as ``out`` (JSON) and ``text`` as the results of its ``.md`` beside it
    (:func:`merge_results`: the notes in that file are kept); print ``text``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=default) + "\n")
    md = out.with_suffix(".md")
    md.write_text(merge_results(md.read_text() if md.exists() else None, text))
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


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's runs as one: each figure the median over the runs that worked
    (a single run as it is)."""
    ok = [r for r in runs if "round_trip" in r]
    if len(runs) == 1 or not ok:
        return runs[-1]

    def med(path: tuple[str, ...]) -> float:
        values = []
        for r in ok:
            v: Any = r
            for key in path:
                v = v[key]
            values.append(float(v))
        return statistics.median(values)

    out: dict[str, Any] = dict(ok[-1])
    out["startup_s"] = med(("startup_s",))
    out["round_trip"] = {k: med(("round_trip", k)) for k in ok[0]["round_trip"]}
    out["burst"] = {k: med(("burst", k)) for k in ok[0]["burst"]}
    out["rounds"] = len(ok)
    return out


def _rounds_note(rounds: int) -> str:
    if rounds == 1:
        return ""
    return f"; {rounds} rounds, the systems alternating, each figure the median of its rounds"


def _paired(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per system, the median over rounds of its p50 / Ray's p50 in the same round,
    and in how many rounds it was the faster."""
    ray = runs.get("ray", [])
    out = {}
    for name, done in runs.items():
        if name == "ray":
            continue
        ratios = [
            mine["round_trip"]["p50_ms"] / theirs["round_trip"]["p50_ms"]
            for mine, theirs in zip(done, ray, strict=False)
            if "round_trip" in mine and "round_trip" in theirs
        ]
        if ratios:
            out[name] = {
                "p50_vs_ray": statistics.median(ratios),
                "faster_rounds": sum(r < 1 for r in ratios),
                "rounds": len(ratios),
            }
    return out


def _paired_note(paired: dict[str, dict[str, Any]]) -> str:
    if not paired:
        return ""
    parts = [
        f"{name} {p['p50_vs_ray']:.2f}x (faster in {p['faster_rounds']} of {p['rounds']})"
        for name, p in paired.items()
    ]
    return (
        "\nPaired round trip p50 against Ray's in the same round (median): "
        + "; ".join(parts)
        + ".\n"
    )


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
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the systems this many times, alternating, and report"
                             " each figure's median over the rounds")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "functions.json")
    args = parser.parse_args()
    if args.system:
        _child(args)
        return
    compile_tree(ROOT)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.only.split(",")}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            print(f"round {r + 1}: running {name} ...", file=sys.stderr, flush=True)
            runs[name].append(_run_system(name, args))
    results = {name: _median_of(done) for name, done in runs.items()}
    paired = _paired(runs) if args.rounds > 1 else {}
    table = _table(results)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "calls": args.calls,
        "burst": args.burst,
        "rounds": args.rounds,
    }
    write_results(
        args.out,
        {"meta": meta, "results": results, "paired": paired},
        f"# Remote functions vs peers\n\n{meta['machine']}, {meta['when']}; {args.calls} round"
        f" trips after {args.warmup} warm-up calls, a burst of {args.burst} calls"
        f"{_rounds_note(args.rounds)}.\n\n"
        f"{table}\n{_paired_note(paired)}",
    )


if __name__ == "__main__":
    main()
