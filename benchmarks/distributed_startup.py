"""Distributed start-up: submit → every rank inside ``init_process_group``.

A probe script imports torch, calls ``init_process_group("gloo")`` and prints the
time it got through; every run has 2 nodes × 2 processes on this machine. Four
ways of starting it, interleaved run by run so that machine load hits them alike:

``bare torchrun``
    two ``torchrun`` processes (node 0 and 1, static rendezvous on 127.0.0.1)
    started by this script: the floor for torchrun.
``gpulayer torchrun``
    ``gl.submit(..., nodes=2, nproc_per_node=2)`` on a LocalCluster with two
    workers: placement, two acquires, the task directory, then torchrun.
``bare direct``
    the four rank processes started by this script with ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``...: the floor without torchrun's agent.
``gpulayer direct``
    the same job with ``launcher="direct"``.

gpulayer's own share is the median of (gpulayer − bare) for the same launcher.
Time starts just before the submit (or the spawn) and ends at the latest rank's
``init_process_group`` return; all processes share this machine's clock. It
measures and reports, never asserts. Run it as::

    .venv/bin/python benchmarks/distributed_startup.py --runs 5
"""

import argparse
import datetime as dt
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from functions import write_results  # a script beside this one

import gpulayer as gl
from gpulayer.cli.cluster import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NODES, NPROC = 2, 2

PROBE = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"initialized {time.time():.6f} rank {os.environ['RANK']}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
_INIT = re.compile(r"initialized (\d+\.\d+) rank (\d+)")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _latest(text: str) -> float:
    found = {int(r): float(t) for t, r in _INIT.findall(text)}
    if len(found) != NODES * NPROC:
        raise RuntimeError(f"only ranks {sorted(found)} initialized:\n{text[-2000:]}")
    return max(found.values())


def bare_torchrun(probe: Path, port: int) -> float:
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={NODES}",
                f"--nproc-per-node={NPROC}",
                f"--node-rank={r}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                "--no-python",
                sys.executable,
                str(probe),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_env(),
            text=True,
        )
        for r in range(NODES)
    ]
    out = "".join(p.communicate(timeout=120)[0] for p in procs)
    return _latest(out) - t0


def bare_direct(probe: Path, port: int) -> float:
    t0 = time.time()
    procs = []
    for rank in range(NODES * NPROC):
        env = {
            **_env(), "RANK": str(rank), "LOCAL_RANK": str(rank % NPROC),
            "WORLD_SIZE": str(NODES * NPROC), "LOCAL_WORLD_SIZE": str(NPROC),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        }  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(probe)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
            )
        )
    out = "".join(p.communicate(timeout=120)[0] for p in procs)
    return _latest(out) - t0


def through_gpulayer(conn: gl.Connection, probe: Path, launcher: str) -> float:
    t0 = time.time()
    job = gl.submit(
        [sys.executable, probe.name], nodes=NODES, nproc_per_node=NPROC, launcher=launcher,
        workdir=probe.parent, env={"OMP_NUM_THREADS": "1"}, connection=conn,
    )  # fmt: skip
    job.wait(timeout=120)
    text = "\n".join(job.logs())
    if job.state != "succeeded":
        raise RuntimeError(f"job {job.id} {job.state}: {job.info.reason}\n{text[-2000:]}")
    return _latest(text) - t0


def _stats(xs: list[float]) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(xs) * 1000,
        "min_ms": min(xs) * 1000,
        "max_ms": max(xs) * 1000,
        "n": len(xs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed_startup.json")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {
        k: [] for k in ("bare torchrun", "gpulayer torchrun", "bare direct", "gpulayer direct")
    }
    with tempfile.TemporaryDirectory() as tmp:
        probe_dir = Path(tmp, "probe")
        probe_dir.mkdir()
        probe = probe_dir / "probe.py"
        probe.write_text(PROBE)
        cluster = LocalCluster(Path(tmp, "cluster"), workers=2, slots=1)
        with cluster, cluster.connection() as conn:
            through_gpulayer(conn, probe, "direct")  # warm-up: caches, bundle upload
            for i in range(args.runs):
                port = 31600 + 2 * i
                samples["bare torchrun"].append(bare_torchrun(probe, port))
                samples["gpulayer torchrun"].append(through_gpulayer(conn, probe, "torchrun"))
                samples["bare direct"].append(bare_direct(probe, port + 1))
                samples["gpulayer direct"].append(through_gpulayer(conn, probe, "direct"))
                last = ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in samples.items())
                print(f"run {i + 1}: {last}", flush=True)
    overhead = {
        launcher: statistics.median(
            g - b
            for g, b in zip(
                samples[f"gpulayer {launcher}"], samples[f"bare {launcher}"], strict=True
            )
        )
        * 1000
        for launcher in ("torchrun", "direct")
    }
    result: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpulayer": gl.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "nodes": NODES,
        "nproc_per_node": NPROC,
        "samples_s": samples,
        "stats": {k: _stats(v) for k, v in samples.items()},
        "gpulayer_overhead_p50_ms": overhead,
    }
    write_results(args.out, result, _markdown(result))


def _markdown(r: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {k} | {s['p50_ms']:.0f} | {s['min_ms']:.0f} | {s['max_ms']:.0f} | {s['n']} |"
        for k, s in r["stats"].items()
    )
    o = r["gpulayer_overhead_p50_ms"]
    return f"""# Distributed start-up: recorded results

`benchmarks/distributed_startup.py --runs {r["stats"]["bare direct"]["n"]}`: submit → the
last of {r["nodes"]} × {r["nproc_per_node"]} ranks returns from `init_process_group("gloo")`,
on a {r["cpus"]}-core machine (load {r["load"]:.2f}) that the client, the control plane,
both workers and all ranks share; gpulayer {r["gpulayer"]}, Python {r["python"]}, {r["when"]}.
Raw samples in `distributed_startup.json`.

| start | p50 ms | min ms | max ms | runs |
|---|---:|---:|---:|---:|
{rows}

gpulayer's own share (median of gpulayer − bare, same launcher, same run):
torchrun **{o["torchrun"]:.0f} ms**, direct **{o["direct"]:.0f} ms**.
"""


if __name__ == "__main__":
    main()
