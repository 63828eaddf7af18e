"""Cell benchmarks: a trivial cell's round trip and print-to-client latency.

Three ways to run the same code in another kernel, side by side in one run on
the same machine. All are started first; then the samples alternate between
them (the order turns at each sample), so that the machine's slow and fast
spells, which change a way's time by 2x within minutes here, fall on all of them
alike and the ratios hold:

local ipykernel (the floor)
    A headless ipykernel on this machine driven by jupyter_client
    (``execute`` → iopub ``idle`` and ``execute_reply``): what any remote
    execution costs at least.
ipyparallel (the peer)
    One engine of a local ``ipyparallel.Cluster``; ``view.execute(code, block=True)``.
gpulayer, warm session
    A ``LocalCluster`` (control plane + one worker) and a session started
    before measuring; each sample is :func:`gpulayer.client.cells.submit` on the
    session, following its relayed messages until the kernel's reply: the path
    ``%%gpulayer --session`` takes, minus IPython rendering. Twice: over the live
    channel (the default, docs/channel.md) and over the HTTP long-poll fallback
    (``GPULAYER_CHANNEL=http`` for the client and the worker).

Two measures per way, after warm-up (all round trips, then all first outputs):

round trip
    ``a = 1``: from submitting the code to knowing it finished.
first output
    ``print(time.time())`` on the remote side → the text arriving in this
    process (both clocks are this machine's).

It measures and reports; it never asserts. Run it as::

    .venv/bin/python benchmarks/cells.py --samples 50
"""

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gpulayer
from gpulayer.cli.cluster import LocalCluster
from gpulayer.client import Connection, cells

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cells.json"
WARMUP = 5
TRIVIAL = "a = 1"
PRINT = "import time; print(repr(time.time()))"

#: A way to run a cell: its round trip (returns nothing) and its first output
#: (returns the print-to-here latency in seconds).
Way = tuple[Callable[[], None], Callable[[], float]]


def summarize(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/min/max/mean in milliseconds."""
    ms = sorted(v * 1000 for v in values_s)
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"n": len(ms), "p50": round(statistics.median(ms), 2), "p90": round(q[89], 2),
            "p99": round(q[98], 2), "min": round(ms[0], 2), "max": round(ms[-1], 2),
            "mean": round(statistics.fmean(ms), 2)}  # fmt: skip


def measure(ways: dict[str, Way], samples: int) -> dict[str, dict[str, Any]]:
    """Warm each way up, then take ``samples`` round trips and first outputs of
    each, the ways alternating (their order turned at every sample)."""
    for trip, first in ways.values():
        for _ in range(WARMUP):
            trip()
            first()
    names = list(ways)
    trips: dict[str, list[float]] = {name: [] for name in names}
    prints: dict[str, list[float]] = {name: [] for name in names}
    for i in range(samples):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t = time.perf_counter()
            ways[name][0]()
            trips[name].append(time.perf_counter() - t)
    for i in range(samples):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            prints[name].append(ways[name][1]())
    return {
        name: {
            "round_trip_ms": summarize(trips[name]),
            "first_output_ms": summarize(prints[name]),
            "round_trip_s": trips[name],
            "first_output_s": prints[name],
        }
        for name in names
    }


# ------------------------------------------------------------------ the ways


@contextlib.contextmanager
def local_kernel() -> Iterator[Way]:
    """The floor: a local ipykernel over jupyter_client (ipc transport)."""
    from jupyter_client.manager import KernelManager

    with tempfile.TemporaryDirectory() as tmp:
        km = KernelManager(kernel_name="python3", transport="ipc",
                           connection_file=str(Path(tmp) / "k.json"))  # fmt: skip
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        try:

            def trip() -> None:
                kc.execute_interactive(TRIVIAL, output_hook=lambda m: None, timeout=30)

            def first() -> float:
                got: list[float] = []

                def hook(m: dict) -> None:
                    if m["msg_type"] == "stream" and not got:
                        got.append(time.time() - float(m["content"]["text"]))

                kc.execute_interactive(PRINT, output_hook=hook, timeout=30)
                return got[0]

            yield trip, first
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


@contextlib.contextmanager
def ipyparallel_engine() -> Iterator[Way]:
    """The peer: one ipyparallel engine, ``view.execute(block=True)``."""
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=1, controller_ip="127.0.0.1", log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(1, timeout=60)
        view = rc[0]

        def trip() -> None:
            view.execute(TRIVIAL, block=True)

        def first() -> float:
            ar = view.execute(PRINT, block=False)
            while True:  # the client's own way to see streamed output: spin and look
                rc.spin()
                text = ar.stdout
                if text:
                    latency = time.time() - float(text.strip())
                    ar.get()
                    return latency
                time.sleep(0.0002)

        yield trip, first
    finally:
        rc.close()
        cluster.stop_cluster_sync()


@contextlib.contextmanager
def gpulayer_session(data_dir: Path, channel: str = "auto") -> Iterator[Way]:
    """gpulayer: cells in a warm session on a local worker, over the live channel
    (``auto``) or HTTP long polls (``http``, for this client and the worker)."""
    env = {"GPULAYER_CHANNEL": channel}
    with (
        LocalCluster(data_dir, workers=1, slots=2, env=env) as cluster,
        Connection(cluster.url, cluster.admin_token, fingerprint=cluster.fingerprint,
                   channel=channel) as conn,
    ):  # fmt: skip
        cells.ensure_session(conn, "bench")
        deadline = time.monotonic() + 60
        while conn.session("bench").state != "running" and time.monotonic() < deadline:
            time.sleep(0.05)

        def trip() -> None:
            run = cells.submit(conn, TRIVIAL, session="bench")
            for _ in run.messages():
                pass
            assert run.reply is not None and run.reply.get("status") == "ok", run.reply

        def first() -> float:
            run = cells.submit(conn, PRINT, session="bench")
            latency = None
            for msg in run.messages():
                if msg.msg_type == "stream" and latency is None:
                    latency = time.time() - float(msg.content["text"])
            assert latency is not None
            return latency

        yield trip, first
        conn.end_session("bench")


# ------------------------------------------------------------------ report


def machine() -> dict[str, Any]:
    """Where it ran."""

    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
            )
        except OSError:
            return ""
        return out.stdout.strip()

    import ipyparallel

    return {
        "gpulayer": gpulayer.__version__,
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain")),
        "ipyparallel": ipyparallel.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": round(os.getloadavg()[0], 2),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def render(result: dict[str, Any]) -> str:
    """The results as a Markdown table (what the script prints)."""
    m = result["machine"]
    dirty = ", with uncommitted changes" if m["dirty"] else ""
    out = [f"gpulayer {m['gpulayer']} ({m['commit']}{dirty}), ipyparallel {m['ipyparallel']},"
           f" {m['cpus']} CPUs (load {m['load']}), Python {m['python']}, {m['when']}", "",
           "| way | round trip p50 | p90 | p99 | first output p50 | p90 | p99 |",
           "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, label in (("local", "local ipykernel (floor)"), ("ipyparallel", "ipyparallel engine"),
                        ("gpulayer", "gpulayer warm session (channel)"),
                        ("gpulayer-http", "gpulayer warm session (HTTP fallback)")):  # fmt: skip
        r = result["ways"].get(name)
        if r is None:
            continue
        t, f = r["round_trip_ms"], r["first_output_ms"]
        out.append(f"| {label} | {t['p50']} ms | {t['p90']} | {t['p99']} | {f['p50']} ms"
                   f" | {f['p90']} | {f['p99']} |")  # fmt: skip
    ways = result["ways"]
    out.append("")
    for name in ("gpulayer", "gpulayer-http"):
        if name in ways and "ipyparallel" in ways:
            ratio = ways[name]["round_trip_ms"]["p50"] / ways["ipyparallel"]["round_trip_ms"]["p50"]
            out.append(f"{name} / ipyparallel round trip (p50): {ratio:.2f}x")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three ways, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--only", choices=["local", "ipyparallel", "gpulayer", "gpulayer-http"], action="append"
    )
    args = p.parse_args(argv)
    todo = args.only or ["local", "ipyparallel", "gpulayer", "gpulayer-http"]
    with (
        tempfile.TemporaryDirectory(prefix="gpulayer-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        started: dict[str, Way] = {}
        for name in todo:
            print(f"... starting {name}", file=sys.stderr, flush=True)
            if name == "local":
                started[name] = stack.enter_context(local_kernel())
            elif name == "ipyparallel":
                started[name] = stack.enter_context(ipyparallel_engine())
            else:
                channel = "http" if name == "gpulayer-http" else "auto"
                started[name] = stack.enter_context(gpulayer_session(Path(tmp) / name, channel))
        print("... measuring, the ways alternating", file=sys.stderr, flush=True)
        ways = measure(started, args.samples)
    result = {"machine": machine(), "samples": args.samples, "ways": ways}
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
