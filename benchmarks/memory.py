"""Control-plane memory: resident set idle, and with 100,000 stored jobs.

One headless control plane (``LocalCluster`` with no worker) is measured from
``/proc/PID/status`` (``VmRSS`` now, ``VmHWM`` the peak so far):

idle
    after start-up and one health request, then again after a short wait.
stored
    ``--jobs`` jobs submitted in batches of 500 (``POST jobs/batch``), each with a
    one-second ``queue_timeout`` and a GPU no worker has, so the sweep ends every one
    ``timed_out`` (they are stored, finished jobs, as a long-lived control plane
    keeps them: retention is off by default).
read
    pages of the stored jobs (``GET jobs?limit=1000``, every state filter) and
    ``--reads`` single jobs by id, as a sidebar and clients do.

With ``--baseline TREE`` the same run is made against the gpulayer in ``TREE``
(``git archive BASE | tar -x -C TREE``), in the same invocation. It measures and
reports; it never asserts::

    .venv/bin/python benchmarks/memory.py [--jobs 100000] [--baseline /tmp/base]

Results go to ``benchmarks/results/memory.json`` and ``memory.md``.
"""

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from functions import write_results  # a script beside this one

from gpulayer import contracts
from gpulayer.cli.cluster import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "memory.json"
BATCH = 500
MIB = 1024 * 1024


def rss(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024 / MIB
    return out


def _progress(text: str) -> None:
    print(f"[memory] {text}", file=sys.stderr, flush=True)


def measure(data_dir: Path, jobs: int, reads: int, pythonpath: str | None) -> dict[str, Any]:
    """One control plane from start to ``jobs`` stored and read."""
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    args = [f"--GpulayerApp.max_queued_jobs_per_owner={jobs + BATCH}"]
    cluster = LocalCluster(data_dir, workers=0, server_args=args, env=env)
    out: dict[str, Any] = {"jobs": jobs}
    try:
        t0 = time.perf_counter()
        cluster.start()
        out["startup_s"] = time.perf_counter() - t0
        pid = cluster.server_pid
        assert pid is not None
        with cluster.connection() as conn:
            conn.health()
            out["idle"] = rss(pid)
            time.sleep(2.0)
            out["idle_after_2s"] = rss(pid)
            spec = contracts.JobSpec(
                command=["true"], resources=contracts.Resources(gpus=1), queue_timeout=1.0
            )
            t0 = time.perf_counter()
            last = None
            for start in range(0, jobs, BATCH):
                last = conn.submit_many([spec] * min(BATCH, jobs - start))[-1]
                if start % 10_000 == 0:
                    _progress(f"{start} submitted, rss {rss(pid)['VmRSS']:.0f} MiB")
            out["submit_s"] = time.perf_counter() - t0
            assert last is not None
            while conn.job(last.id).state == contracts.JobState.queued:
                time.sleep(1.0)  # the sweep ends them, oldest deadline first
            out["all_ended_s"] = time.perf_counter() - t0
            out["stored"] = rss(pid)
            ids = [j.id for j in conn.jobs(limit=10_000)]
            for state in (None, "timed_out", "queued", "succeeded"):
                for _ in range(3):
                    conn.jobs(state=state, limit=1000)
            for job_id in random.Random(1).sample(ids, min(reads, len(ids))):
                conn.job(job_id)
            out["read"] = rss(pid)
    finally:
        cluster.stop()
    return out


def render(result: dict[str, Any]) -> str:
    """The Markdown summary."""
    runs = result["runs"]
    names = list(runs)
    lines = [
        "# Control-plane memory",
        "",
        f"`benchmarks/memory.py --jobs {result['jobs']}` on {result['cpus']} CPUs"
        f" (load {result['load']:.1f}, {result['date']}). RSS of the control-plane process"
        " in MiB (peak: VmHWM).",
        "",
        "| measure | " + " | ".join(names) + " | target |",
        "|---|" + "---:|" * len(names) + "---|",
    ]
    rows = [
        ("idle (after start-up)", "idle", "VmRSS", "≤ 200"),
        ("idle, 2 s later", "idle_after_2s", "VmRSS", "≤ 200"),
        (f"{result['jobs']} jobs stored (all ended)", "stored", "VmRSS", "≤ 500"),
        ("after reading pages and single jobs", "read", "VmRSS", "≤ 500"),
        ("peak over the run", "read", "VmHWM", ""),
    ]
    for label, key, field, target in rows:
        cells = [f"{runs[n][key][field]:.0f}" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    lines.append(
        "| submit, then all ended (s) | "
        + " | ".join(f"{runs[n]['submit_s']:.0f}, {runs[n]['all_ended_s']:.0f}" for n in names)
        + " | |"
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--reads", type=int, default=2000, help="single jobs read by id")
    ap.add_argument("--baseline", type=Path, metavar="TREE")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "jobs": args.jobs, "cpus": os.cpu_count(), "load": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d"), "runs": {},
    }  # fmt: skip
    trees = {"this tree": None}
    if args.baseline:
        trees["baseline"] = str(args.baseline.resolve())
    with tempfile.TemporaryDirectory(prefix="gpulayer-memory-") as tmp:
        for i, (name, tree) in enumerate(trees.items()):
            _progress(f"{name}: {args.jobs} jobs")
            result["runs"][name] = measure(Path(tmp, f"run{i}"), args.jobs, args.reads, tree)
    write_results(args.out, result, render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
