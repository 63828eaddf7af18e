"""Scheduler benchmark: placement at scale, in process and through HTTP.

In process (no HTTP): a real SQLite store, 10,000 queued jobs with mixed
requirements and 200 simulated workers (mixed GPU models, labels, slots):

* one full placement pass over the queue (what happens when capacity appears),
  reported as the pass time and the time per placement decision (jobs examined);
* a pass on a saturated cluster (no free slot: what every submit costs then);
* pending reasons (``Scheduler.placement``) for sampled queued jobs, per job;
* the memory the scheduler's caches and the queue take (tracemalloc).

Through HTTP: ``LocalCluster`` with ``--http-workers`` real worker processes
(simulated GPUs) and ``--http-jobs`` trivial GPU and CPU jobs submitted by the
public client; reports the end-to-end throughput and the submit rate.

Prints a table and writes ``benchmarks/results/scheduler.json``. Never asserts.

    .venv/bin/python benchmarks/scheduler.py [--jobs 10000] [--workers 200]
        [--http-workers 20] [--http-jobs 400] [--skip-http]
"""

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import gpulayer
from gpulayer.contracts import JobSpec, JobState, WorkerRegistration, WorkerState
from gpulayer.worker.devices import parse_simulated
from jupyter_ext import transitions
from jupyter_ext.artifacts import BlobStore
from jupyter_ext.auth import TokenService
from jupyter_ext.control_plane import ControlPlane
from jupyter_ext.store import Store, WorkerRecord
from jupyter_ext.streams import Notifier

GPU_MIXES = ["8xA100-80GB", "4xH100-80GB", "2xT4-16GB", "1xL4-24GB", ""]
REQUIREMENTS = [
    {},
    {"gpus": 1},
    {"gpus": 1, "gpu_memory": "40GiB"},
    {"gpus": 2, "gpu_model": "A100|H100"},
    {"gpus": 4, "min_compute_capability": "9.0"},
    {"gpus": 8},
    {"gpus": 1, "selector": {"zone": "eu"}},
    {"cpus": 4, "memory": "16GiB"},
]


def _registration(i: int, rng: random.Random) -> WorkerRegistration:
    mix = GPU_MIXES[i % len(GPU_MIXES)]
    devices = parse_simulated(mix)
    return WorkerRegistration(
        name=f"w{i:03d}", hostname=f"h{i:03d}", cpus=32, memory_bytes=256 << 30,
        devices=devices, labels={"zone": rng.choice(["eu", "us"])}, slots=4, version="bench",
    )  # fmt: skip


async def in_process(n_jobs: int, n_workers: int, samples: int, seed: int) -> dict:
    """Measure placement against an in-process scheduler on a temp SQLite file."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store(Path(tmp) / "bench.db").open()
        sched = ControlPlane(store, BlobStore(Path(tmp) / "blobs"), Notifier(), TokenService(store))
        # Jobs are queued first (no worker yet: each submit is cheap), then all the
        # workers appear at once and one timed pass places what fits.
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        t0 = time.perf_counter()
        for i in range(n_jobs):
            res = REQUIREMENTS[i % len(REQUIREMENTS)]
            await sched.jobs.submit(JobSpec(command=["true"], resources=res,
                                       priority=rng.choice([0, 0, 0, 1])), "bench")  # fmt: skip
        submit_s = time.perf_counter() - t0
        now = time.time()
        for i in range(n_workers):
            reg = _registration(i, rng)
            info = reg.model_dump_json(include={"cpus", "memory_bytes", "devices", "labels",
                                                "slots", "version"})  # fmt: skip
            await store.upsert_worker(WorkerRecord(
                id=f"id{i:04d}", name=reg.name, hostname=reg.hostname, state=WorkerState.ready,
                info_json=info, registered_at=now, last_heartbeat=now, cpu_percent=None,
                memory_used=None, draining=False,
            ))  # fmt: skip
        queued = await store.count_jobs([JobState.queued])
        t0 = time.perf_counter()
        placed = await sched.placer.schedule()
        full_pass = time.perf_counter() - t0
        t0 = time.perf_counter()
        await sched.placer.schedule()
        saturated_pass = time.perf_counter() - t0
        # Free one slot on one worker: the next pass must find the first job that fits.
        # (Its task starts and ends through the transitions; its job stays running.)
        [t] = (await store.active_tasks())[:1]
        job = await store.get_job(t.job_id)
        assert job is not None
        now = time.time()
        running = dataclasses.replace(t, state=JobState.running)
        await store.apply(
            transitions.started(now, job, t, now + 30)
            + transitions.task_end(now, running, JobState.succeeded, 0, "benchmark")
        )
        t0 = time.perf_counter()
        refill = await sched.placer.schedule()
        one_slot_pass = time.perf_counter() - t0
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        mem = sum(s.size_diff for s in after.compare_to(before, "filename"))
        rows = await store.list_jobs(JobState.queued, n_jobs)
        picks = rng.sample(rows, min(samples, len(rows)))
        reason_ms = []
        for row in picks:
            t0 = time.perf_counter()
            await sched.jobs.placement(row.id)
            reason_ms.append((time.perf_counter() - t0) * 1000)
        await store.close()
    return {
        "jobs": n_jobs, "workers": n_workers, "slots": 4 * n_workers,
        "submit_seconds": submit_s, "queued_before_pass": queued, "placed": placed,
        "full_pass_ms": full_pass * 1000,
        "per_decision_ms": full_pass * 1000 / max(1, queued),
        "per_placed_job_ms": full_pass * 1000 / max(1, placed),
        "saturated_pass_ms": saturated_pass * 1000,
        "one_free_slot_pass_ms": one_slot_pass * 1000, "one_free_slot_placed": refill,
        "pending_reasons_ms": _stats(reason_ms),
        "python_heap_mib": mem / 2**20,
    }  # fmt: skip


async def queue_length(lengths: list[int], samples: int) -> dict:
    """A submit's placement pass, and a pass after a completion, with ``n`` jobs queued
    that cannot fit (each wants the one GPU, which a running job holds) for each ``n``
    in ``lengths``; the timed jobs need no GPU and are placed at once. The queue is
    filled straight through the store (no pass per batch), then one untimed pass."""
    from jupyter_ext.core import Quotas

    out = {}
    for n in lengths:
        with tempfile.TemporaryDirectory() as tmp:
            store = await Store(Path(tmp) / "bench.db").open()
            quotas = Quotas(queued_jobs_per_owner=10**7)
            sched = ControlPlane(store, BlobStore(Path(tmp) / "blobs"), Notifier(),
                                 TokenService(store), quotas=quotas)  # fmt: skip
            reg = WorkerRegistration(name="box", hostname="box", cpus=32, memory_bytes=64 << 30,
                                     devices=parse_simulated("1xA100-80GB"), slots=4,
                                     version="bench")  # fmt: skip
            await sched.workers.register(reg)
            gpu = JobSpec(command=["true"], resources={"gpus": 1})
            await sched.jobs.submit(gpu, "bench")  # holds the GPU from now on
            spec_json, now = gpu.model_dump_json(), time.time()
            for start in range(0, n, 5000):
                stmts = []
                for i in range(start, min(n, start + 5000)):
                    stmts += transitions.submitted(now, f"q{i:08d}", spec_json, "bench", 0)
                await store.apply(stmts)
            await sched.placer.schedule()  # untimed: reads what the fill stored
            submit_ms, pass_ms = [], []
            for _ in range(samples):
                t0 = time.perf_counter()
                job = await sched.jobs.submit(JobSpec(command=["true"]), "bench")
                submit_ms.append((time.perf_counter() - t0) * 1000)
                assert job.state == JobState.scheduled, job.state
                await sched.jobs.cancel(job.id, "bench")  # its slot is free again
                t0 = time.perf_counter()
                await sched.placer.schedule()
                pass_ms.append((time.perf_counter() - t0) * 1000)
            await store.close()
        out[str(n)] = {"submit_ms": _stats(submit_ms), "pass_ms": _stats(pass_ms)}
        print(f"  {n} queued: submit p50 {out[str(n)]['submit_ms']['p50']:.1f} ms,"
              f" pass p50 {out[str(n)]['pass_ms']['p50']:.1f} ms", file=sys.stderr)  # fmt: skip
    return out


def over_http(n_workers: int, n_jobs: int) -> dict:
    """Throughput with real worker processes (simulated GPUs) through HTTP."""
    from gpulayer.cli.cluster import LocalCluster
    from gpulayer.client import submit

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cluster = LocalCluster(tmp, workers=n_workers, slots=2, simulated_gpus="2xA100-80GB")
        try:
            cluster.start()
            startup = time.perf_counter() - t0
            with cluster.connection() as conn:
                t0 = time.perf_counter()
                jobs = [submit(["true"], gpus=i % 3 and 1, connection=conn) for i in range(n_jobs)]
                submitted = time.perf_counter() - t0
                for j in jobs:
                    j.wait(timeout=600)
                total = time.perf_counter() - t0
                states: dict[str, int] = {}
                for j in jobs:
                    states[str(j.state)] = states.get(str(j.state), 0) + 1
        finally:
            cluster.stop()
    return {
        "workers": n_workers, "jobs": n_jobs, "startup_seconds": startup,
        "submit_jobs_per_s": n_jobs / submitted, "end_to_end_jobs_per_s": n_jobs / total,
        "total_seconds": total, "states": states,
    }  # fmt: skip


def _baseline(args: argparse.Namespace) -> dict:
    """The queue-length section run against the gpulayer in ``args.baseline``."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "baseline.json"
        cmd = [sys.executable, __file__, "--skip-full", "--skip-http", "--out", str(out),
               "--queue-samples", str(args.queue_samples), "--queue-lengths",
               *map(str, args.queue_lengths)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
        print(f"baseline: {args.baseline} ...", file=sys.stderr)
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        return dict(json.loads(out.read_text())["queue_length"])


def _stats(ms: list[float]) -> dict:
    if not ms:
        return {}
    q = statistics.quantiles(ms, n=100) if len(ms) > 1 else [ms[0]] * 99
    return {"n": len(ms), "p50": q[49], "p90": q[89], "p99": q[98], "max": max(ms)}


def main() -> int:
    """Run the benchmark and write its results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=200)
    ap.add_argument("--samples", type=int, default=100, help="jobs whose reasons are timed")
    ap.add_argument("--http-workers", type=int, default=20)
    ap.add_argument("--http-jobs", type=int, default=400)
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument(
        "--queue-lengths",
        type=int,
        nargs="*",
        default=[1000, 10000, 30000],
        help="queue lengths for the submit/pass latency section (none: skip it)",
    )
    ap.add_argument("--queue-samples", type=int, default=20)
    ap.add_argument("--skip-full", action="store_true", help="skip the in-process section")
    ap.add_argument("--baseline", type=Path, metavar="TREE",
                    help="also run the queue-length section against the gpulayer in TREE"
                    " (e.g. `git archive BASE | tar -x -C TREE`), in the same run")  # fmt: skip
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results/scheduler.json")
    args = ap.parse_args()

    result: dict = {
        "gpulayer": gpulayer.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(), "load": os.getloadavg()[0],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    if args.queue_lengths:
        print("queue length ...", file=sys.stderr)
        q = result["queue_length"] = asyncio.run(
            queue_length(args.queue_lengths, args.queue_samples)
        )
        base = result["baseline_queue_length"] = _baseline(args) if args.baseline else {}
        print("\n## Queue length: a submit's pass and a completion's pass\n")
        print("| queued (none fit) | submit p50 / p90 | pass p50 / p90 |"
              + (" baseline submit p50 | baseline pass p50 |" if base else "")
              + "\n|---:|---:|---:|" + ("---:|---:|" if base else ""))  # fmt: skip
        for n, row in q.items():
            sm, pm = row["submit_ms"], row["pass_ms"]
            line = (f"| {n} | {sm['p50']:.1f} / {sm['p90']:.1f} ms"
                    f" | {pm['p50']:.1f} / {pm['p90']:.1f} ms |")  # fmt: skip
            if n in base:
                b = base[n]
                line += f" {b['submit_ms']['p50']:.1f} ms | {b['pass_ms']['p50']:.1f} ms |"
            print(line)
    if args.skip_full:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    print(f"in process: {args.jobs} queued jobs, {args.workers} workers ...", file=sys.stderr)
    ip = result["in_process"] = asyncio.run(
        in_process(args.jobs, args.workers, args.samples, args.seed)
    )
    print(f"\n## In process ({ip['jobs']} jobs, {ip['workers']} workers, {ip['slots']} slots)\n")
    print("| measure | value |\n|---|---:|")
    print(f"| submit {ip['jobs']} jobs (before any worker) | {ip['submit_seconds']:.1f} s |")
    print(f"| full pass: {ip['queued_before_pass']} queued, {ip['placed']} placed "
          f"| {ip['full_pass_ms']:.0f} ms |")  # fmt: skip
    print(f"| per placement decision (full pass / queued) | {ip['per_decision_ms']:.3f} ms |")
    print(f"| per placed job | {ip['per_placed_job_ms']:.3f} ms |")
    print(f"| pass on a saturated cluster (every submit then) | {ip['saturated_pass_ms']:.1f} ms |")
    print(f"| pass after one slot frees ({ip['one_free_slot_placed']} placed) "
          f"| {ip['one_free_slot_pass_ms']:.1f} ms |")  # fmt: skip
    r = ip["pending_reasons_ms"]
    print(f"| pending reasons per job, p50 / p99 | {r['p50']:.2f} / {r['p99']:.2f} ms |")
    print(f"| Python heap growth (queue + caches) | {ip['python_heap_mib']:.0f} MiB |")
    if not args.skip_http:
        print(f"\nover HTTP: {args.http_workers} worker processes ...", file=sys.stderr)
        h = result["http"] = over_http(args.http_workers, args.http_jobs)
        print(f"\n## Through HTTP ({h['workers']} worker processes, {h['jobs']} jobs)\n")
        print("| measure | value |\n|---|---:|")
        print(f"| cluster start-up | {h['startup_seconds']:.1f} s |")
        print(f"| submit rate | {h['submit_jobs_per_s']:.0f} jobs/s |")
        print(f"| end-to-end throughput | {h['end_to_end_jobs_per_s']:.0f} jobs/s |")
        print(f"| states | {h['states']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
