"""Start-up: ``gpulayer up`` (a ``LocalCluster`` with 2 workers) to the first result
of a remote function, against a Dask ``LocalCluster`` (2 worker processes), in one run.

Each start runs in a fresh interpreter through ``functions.py --system NAME`` (the
same code ``functions.py`` times; imports not counted), ``--rounds`` times,
alternating the systems so that the machine's load falls on all of them alike.
With ``--baseline TREE`` (``git archive BASE | tar -x -C TREE``) gpulayer from
that tree runs in the same rounds. Run it with an interpreter that has the peers
(``pip install -e ".[bench]"``, or a separate venv with this tree on
``PYTHONPATH``). It reports medians and never asserts::

    PYTHONPATH=. /work/bench-venv/bin/python benchmarks/startup.py --rounds 7 \\
        [--baseline /tmp/base]

Results go to ``benchmarks/results/startup.json`` and ``startup.md``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from functions import compile_tree, write_results  # noqa: E402  (a script beside this one)

DEFAULT_OUT = HERE / "results" / "startup.json"


def one(system: str, pythonpath: str | None) -> float | None:
    """Seconds from start to the first result, or None when the run failed."""
    argv = [sys.executable, str(HERE / "functions.py"), "--system", system,
            "--calls", "1", "--warmup", "0", "--burst", "1"]  # fmt: skip
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(json.loads(line[len("RESULT ") :])["startup_s"])
    print(f"{system}: exit {proc.returncode}: {proc.stderr[-500:]}", file=sys.stderr)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", type=Path, metavar="TREE")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    runs: dict[str, tuple[str, str | None]] = {"gpulayer (this tree)": ("gpulayer", None)}
    if args.baseline:
        runs["gpulayer (baseline)"] = ("gpulayer", str(args.baseline.resolve()))
    runs["dask LocalCluster"] = ("dask", None)
    for tree in (HERE.parent, args.baseline):  # as installed: with its bytecode
        if tree is not None:
            compile_tree(tree.resolve())
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, (system, path) in runs.items():
            s = one(system, path)
            if s is not None:
                samples[name].append(s)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.2f}s" for n, v in samples.items()
                                             if v), file=sys.stderr)  # fmt: skip
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
        "load": os.getloadavg()[0], "rounds": args.rounds, "samples": samples,
    }  # fmt: skip
    lines = [
        "# Start-up to the first function result",
        "",
        f"`benchmarks/startup.py --rounds {args.rounds}` on {result['cpus']} CPUs"
        f" (load {result['load']:.1f}, {result['date']}); seconds, each start in a fresh"
        " interpreter, the systems alternating.",
        "",
        "| start | median (s) | min (s) | max (s) | runs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in samples.items():
        if v:
            lines.append(
                f"| {name} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} | {len(v)} |"
            )
    write_results(args.out, result, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
