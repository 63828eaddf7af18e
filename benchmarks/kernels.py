"""Kernel benchmarks: a gpulayer kernel next to a local ipykernel (issue 21).

Two kernels, side by side in one run on the same machine, both started by
jupyter_client's ``AsyncKernelManager`` and driven by its ``AsyncKernelClient``
over TCP on 127.0.0.1, as a Jupyter server does:

local ipykernel (the floor)
    The ``python3`` kernelspec: what any kernel costs at least.
gpulayer kernel
    A kernelspec written by ``gpulayer kernel install --gpus 1`` into a private
    data dir, against a ``LocalCluster`` (control plane + one worker with one
    simulated GPU). The client talks to the provisioner's local ports; each
    message goes through the relay (the provisioner's ProxyEnd, the control plane,
    the worker's KernelEnd) to an ipykernel on the worker and back.

The samples alternate between the two kernels (local, gpulayer, local, ...), so
load from other processes on a shared machine falls on both alike. After warm-up,
per kernel:

round trip
    ``a = 1``: ``execute_request`` → its ``execute_reply`` and iopub ``idle``
    (``execute_interactive``).
completion
    ``complete_request`` → ``complete_reply``, for ``os.pa`` (``os`` imported in
    the warm-up) and for ``import o``.

Targets (issue 21): gpulayer round trip p50 ≤ local p50 + 3 ms; completion p50
≤ 50 ms. It measures and reports; it never asserts. Run it as::

    .venv/bin/python benchmarks/kernels.py --samples 200
"""

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import gpulayer
from gpulayer.cli import kernels as kernelspecs
from gpulayer.cli.cluster import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "kernels.json"
WARMUP = 20
TRIVIAL = "a = 1"
COMPLETIONS = {"os.pa": "os.pa", "import o": "import o"}
#: Issue 21's targets, in ms.
ROUND_TRIP_OVER_LOCAL_MS = 3.0
COMPLETION_MS = 50.0


def summarize(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/min/max/mean in milliseconds."""
    ms = sorted(v * 1000 for v in values_s)
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"n": len(ms), "p50": round(statistics.median(ms), 2), "p90": round(q[89], 2),
            "p99": round(q[98], 2), "min": round(ms[0], 2), "max": round(ms[-1], 2),
            "mean": round(statistics.fmean(ms), 2)}  # fmt: skip


# ------------------------------------------------------------------ measures


def round_trip(
    kc: Any, phases: list[dict[str, float]] | None = None
) -> Callable[[], Awaitable[None]]:
    """``a = 1`` until its reply and iopub idle; with ``phases``, each run appends
    where the time went, from the kernel's own timestamps (one machine, one clock):
    ``inbound`` (sent → the kernel's ``busy``), ``kernel`` (``busy`` → ``idle``)
    and ``outbound`` (the kernel's ``idle`` → it arrived here)."""

    async def run() -> None:
        seen: dict[str, float] = {}

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "status":
                state = msg["content"]["execution_state"]
                seen[state] = _epoch(msg["header"]["date"])
                seen[f"{state}_here"] = time.time()

        sent = time.time()
        reply = await kc.execute_interactive(TRIVIAL, output_hook=hook, timeout=30)
        assert reply["content"]["status"] == "ok", reply
        if phases is not None and "busy" in seen and "idle" in seen:
            phases.append({"inbound": seen["busy"] - sent, "kernel": seen["idle"] - seen["busy"],
                           "outbound": seen["idle_here"] - seen["idle"]})  # fmt: skip

    return run


def _epoch(date: Any) -> float:
    """A message header's date (jupyter_client gives a datetime) as epoch seconds."""
    if isinstance(date, str):
        date = dt.datetime.fromisoformat(date)
    return float(date.timestamp())


def completion(kc: Any, code: str) -> Callable[[], Awaitable[None]]:
    """One ``complete_request`` for ``code`` (cursor at its end) until the reply."""

    async def run() -> None:
        reply = await kc.complete(code, len(code), reply=True, timeout=30)
        assert reply["content"]["status"] == "ok" and reply["content"]["matches"], reply

    return run


async def timed(step: Callable[[], Awaitable[None]]) -> float:
    t = time.perf_counter()
    await step()
    return time.perf_counter() - t


async def side_by_side(
    clients: dict[str, Any], samples: int
) -> dict[str, dict[str, dict[str, Any]]]:
    """Warm up every kernel, then alternate samples between them, one measure at a time."""
    measures: dict[str, Callable[[Any], Callable[[], Awaitable[None]]]] = {"round_trip": round_trip}
    for label, code in COMPLETIONS.items():
        measures[f"complete {label}"] = lambda kc, code=code: completion(kc, code)
    for kc in clients.values():
        await round_trip(kc)()
        await kc.execute_interactive("import os", output_hook=lambda m: None, timeout=30)
        for make in measures.values():
            for _ in range(WARMUP):
                await make(kc)()
    out: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in clients}
    for measure, make in measures.items():
        steps = {name: make(kc) for name, kc in clients.items()}
        got: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(samples):
            for name, step in steps.items():
                got[name].append(await timed(step))
        for name, values in got.items():
            out[name][measure] = {"ms": summarize(values), "s": values}
        if {"local", "gpulayer"} <= set(got):  # sample i of both ran back to back
            diffs = [g - lo for g, lo in zip(got["gpulayer"], got["local"], strict=True)]
            out["gpulayer"][measure]["paired_over_local_ms"] = summarize(diffs)
    for name, kc in clients.items():  # where a round trip's time goes (a separate pass)
        phases: list[dict[str, float]] = []
        step = round_trip(kc, phases)
        for _ in range(samples):
            await step()
        out[name]["round_trip_phases"] = {
            k: summarize([p[k] for p in phases]) for k in ("inbound", "kernel", "outbound")
        }
    return out


# ------------------------------------------------------------------ kernels


async def started(kernel_name: str) -> tuple[Any, Any, float]:
    """A started kernel, its ready client, and how long the start took (s)."""
    from jupyter_client.manager import AsyncKernelManager

    t = time.perf_counter()
    km = AsyncKernelManager(kernel_name=kernel_name)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return km, kc, time.perf_counter() - t


async def run_all(
    samples: int, tmp: Path, profile: tuple[str, Path, float] | None = None
) -> dict[str, Any]:
    """Start the cluster and both kernels, measure, stop everything."""
    spec = kernelspecs.kernelspec(gpus=1)
    kernelspecs.install("gl-bench", spec, user=False, prefix=str(tmp / "prefix"))
    data = tmp / "prefix" / "share" / "jupyter"
    os.environ["JUPYTER_PATH"] = str(data)
    with LocalCluster(tmp / "cluster", workers=1, slots=2,
                      simulated_gpus="1xA100-80GB") as cluster:  # fmt: skip
        # the provisioner in this process reads these (a Jupyter server's own
        # control plane would be used first; this process is no Jupyter server)
        os.environ["GPULAYER_URL"] = cluster.url
        os.environ["GPULAYER_TOKEN"] = cluster.admin_token
        os.environ["GPULAYER_CONFIG"] = str(tmp / "absent.json")
        kernels = {}
        starts = {}
        profiles: dict[str, Any] = {}
        try:
            for name, kernel_name in (("local", "python3"), ("gpulayer", "gl-bench")):
                print(f"... starting {name}", file=sys.stderr, flush=True)
                km, kc, took = await started(kernel_name)
                kernels[name] = (km, kc)
                starts[name] = round(took, 2)
            print("... measuring", file=sys.stderr, flush=True)
            result = await side_by_side({n: kc for n, (_, kc) in kernels.items()}, samples)
            if profile is not None:
                pids = {
                    "control plane": cluster.server_pid,
                    "worker agent": cluster.worker_pid("local-1"),
                    "client + provisioner": os.getpid(),
                }
                profiles = await profiled(kernels["gpulayer"][1], pids, *profile)
        finally:
            for km, kc in kernels.values():
                kc.stop_channels()
                await km.shutdown_kernel(now=True)
    return {"start_s": starts, "kernels": result, **({"profile": profiles} if profile else {})}


# ------------------------------------------------------------------ profile


async def profiled(kc: Any, pids: dict[str, int | None], spy: str, out: Path,
                   seconds: float) -> dict[str, Any]:  # fmt: skip
    """gpulayer round trips for ``seconds`` while py-spy samples each relay process
    (without pausing it): CPU per round trip, and the functions it goes to."""
    rate = 1000
    out.mkdir(parents=True, exist_ok=True)
    spies = {}
    for name, pid in pids.items():
        if pid is None:
            continue
        raw = out / f"{name.replace(' ', '-').replace('+', 'and')}.txt"
        argv = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate",
                str(rate), "--nonblocking", "--format", "raw", "--output", str(raw)]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        spies[name] = (proc, raw)
    await asyncio.sleep(1.0)  # py-spy attached
    step, trips = round_trip(kc), 0
    deadline = time.monotonic() + seconds - 2.0
    while time.monotonic() < deadline:
        await step()
        trips += 1
    report: dict[str, Any] = {"round_trips": trips, "rate_hz": rate, "processes": {}}
    for name, (proc, raw) in spies.items():
        await proc.wait()
        report["processes"][name] = _collapse(raw, rate, trips, seconds)
    return report


#: Leaf frames of a thread that waits (py-spy's ``--nonblocking`` samples count them).
_WAITING = frozenset({"EpollSelector.select", "Condition.wait", "Event.wait", "_worker",
                      "_connection_worker_thread"})  # fmt: skip


def _collapse(raw: Path, rate: int, trips: int, seconds: float) -> dict[str, Any]:
    """py-spy's collapsed stacks without the waiting ones: CPU ms per round trip, and
    the functions the CPU went to (``self``: the leaf; ``inclusive``: with callees)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    busy = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rpartition(" ")
        frames = [f.split(" (")[0] for f in stack.split(";")]
        if frames[-1] in _WAITING:
            continue
        n = int(count)
        busy += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in dict.fromkeys(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n

    def top(counts: dict[str, int], k: int) -> list[dict[str, Any]]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:k]
        return [{"function": f, "share": round(n / max(busy, 1), 3)} for f, n in ranked]

    # samples cover the whole recording; the round trips ran for seconds - 3 of it
    per_trip = busy / rate * 1000 / max(trips, 1) * (seconds - 3.0) / seconds
    return {"busy_samples": busy, "cpu_ms_per_round_trip": round(per_trip, 3),
            "top_self": top(own, 12), "top_inclusive": top(inclusive, 40)}  # fmt: skip


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

    import ipykernel
    import jupyter_client

    return {
        "gpulayer": gpulayer.__version__,
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(
            git("status", "--porcelain", "--untracked-files=no", "gpulayer", "jupyter_ext")
        ),
        "ipykernel": ipykernel.__version__,
        "jupyter_client": jupyter_client.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def targets(kernels: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 21's targets, met or not."""
    local, gl = kernels["local"], kernels["gpulayer"]
    over = gl["round_trip"]["ms"]["p50"] - local["round_trip"]["ms"]["p50"]
    out = {
        "round_trip_over_local_p50": {
            "ms": round(over, 2), "target_ms": ROUND_TRIP_OVER_LOCAL_MS,
            "met": over <= ROUND_TRIP_OVER_LOCAL_MS,
        }
    }  # fmt: skip
    for label in COMPLETIONS:
        p50 = gl[f"complete {label}"]["ms"]["p50"]
        out[f"complete {label} p50"] = {"ms": p50, "target_ms": COMPLETION_MS,
                                        "met": p50 <= COMPLETION_MS}  # fmt: skip
    return out


def render(result: dict[str, Any]) -> str:
    """The results as a Markdown table (what the script prints)."""
    m = result["machine"]
    dirty = ", with uncommitted changes" if m["dirty"] else ""
    out = [f"gpulayer {m['gpulayer']} ({m['commit']}{dirty}), ipykernel {m['ipykernel']},"
           f" jupyter_client {m['jupyter_client']}, {m['cpus']} CPUs (load {m['load_before']}"
           f" before, {m['load_after']} after), Python {m['python']}, {m['when']};"
           f" {result['samples']} samples each, alternating", "",
           "| kernel | measure | p50 | p90 | p99 | min | max |",
           "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    kernels = result["kernels"]
    for measure in [m for m in kernels["local"] if m != "round_trip_phases"]:
        for name in ("local", "gpulayer"):
            r = kernels[name][measure]["ms"]
            out.append(f"| {name} | {measure} | {r['p50']} ms | {r['p90']} | {r['p99']}"
                       f" | {r['min']} | {r['max']} |")  # fmt: skip
    out += ["", "Where a round trip goes (p50, from the kernel's timestamps):", "",
            "| kernel | inbound (sent → busy) | kernel (busy → idle) | outbound (idle → here) |",
            "|---|---:|---:|---:|"]  # fmt: skip
    for name in ("local", "gpulayer"):
        ph = kernels[name]["round_trip_phases"]
        out.append(f"| {name} | {ph['inbound']['p50']} ms | {ph['kernel']['p50']} ms"
                   f" | {ph['outbound']['p50']} ms |")  # fmt: skip
    out += ["", "| target | measured | target | met |", "|---|---:|---:|---|"]
    for name, t in result["targets"].items():
        out.append(
            f"| {name} | {t['ms']} ms | {t['target_ms']} ms | {'yes' if t['met'] else 'NO'} |"
        )
    paired = kernels["gpulayer"]["round_trip"].get("paired_over_local_ms")
    if paired:
        out += ["", f"round trip, gpulayer minus local, sample by sample: p50 {paired['p50']} ms,"
                f" p90 {paired['p90']} ms"]  # fmt: skip
    for name, prof in result.get("profile", {}).get("processes", {}).items():
        funcs = ", ".join(f"{t['function']} {t['share']:.0%}" for t in prof["top_self"][:6])
        out += ["", f"py-spy, {name}: {prof['cpu_ms_per_round_trip']} ms CPU per round trip;"
                f" most of it in (self) {funcs}"]  # fmt: skip
    starts = ", ".join(f"{k} {v} s" for k, v in result["start_s"].items())
    out += ["", f"kernel start (start_kernel → ready): {starts}"]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both kernels, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="afterwards, sample the relay's processes with py-spy into DIR",
    )
    p.add_argument("--profile-seconds", type=float, default=20.0)
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "/tmp/spyvenv3/bin/py-spy")
    args = p.parse_args(argv)  # fmt: skip
    info = machine()
    profile = None if args.profile is None else (args.py_spy, args.profile, args.profile_seconds)
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-") as tmp:
        measured = asyncio.run(run_all(args.samples, Path(tmp), profile))
    info["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result = {"machine": info, "samples": args.samples, **measured}
    result["targets"] = targets(result["kernels"])
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
