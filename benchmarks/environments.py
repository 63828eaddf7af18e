"""Job environments: gpulayer's (uv, cached) beside Ray's ``runtime_env`` (pip and uv).

Every system installs the same requirement: ``glbench==1.0``, a small pure-Python
wheel this script builds into a temporary folder (found through ``find_links``, so
no index is involved and no download is timed). Each system runs in its own fresh
interpreter (``--system NAME``), one after the other, with two worker processes.

gpulayer (a ``LocalCluster`` with one 2-slot worker and an empty env cache)
    command, no env
        ``submit(["true"]).wait()``, p50 of ``--samples`` after warm-up.
    command, cold build
        The first job asking for the env: submit to done, and the build time the
        worker reported (``environment.build_seconds``).
    command, cache hit
        The same env again, p50 of ``--samples``, timed in turns with "no env"
        (the same load drift in both); the overhead is the difference of the p50s.
    function, no env / cache hit
        A warm ``f.run()`` (``@gl.remote``) without an env, and with the env
        (built once before), p50 of ``--samples``.
    function, cold build
        The first call of a function asking for a new env (a second requirement
        set, so it is not a cache hit): the build and the runner's start.

Ray (``ray.init(num_cpus=2)``)
    task, no env
        ``ray.get(f.remote())``, p50.
    pip / uv: cold build
        The first ``ray.get(f.options(runtime_env=...).remote())``: Ray builds the
        env (virtualenv + pip, or uv) and starts a worker in it.
    pip / uv: cache hit
        The same call again, p50 (Ray keeps a worker per runtime env).

Ray has no command jobs of its own on this path (its job API starts a driver
process per job); its task numbers are the counterpart of gpulayer's functions.

Run it with the peers' venv (never the project's own), the tree as the gpulayer
it measures::

    PYTHONPATH=$PWD /work/bench-venv/bin/python benchmarks/environments.py

It writes ``benchmarks/results/environments.json`` and ``.md``; nothing asserts a time.
"""

import argparse
import base64
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from functions import write_results  # a script beside this one

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = ("gpulayer", "ray")
PACKAGE, VERSION = "glbench", "1.0"


def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of module ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def _p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _paired(a: Any, b: Any, n: int) -> tuple[list[float], list[float]]:
    """``a`` and ``b`` timed in turns, ``n`` times each: on a shared machine the load
    drifts, and interleaving puts the same drift into both."""
    out_a, out_b = [], []
    for _ in range(n):
        out_a += _timed(a, 1)
        out_b += _timed(b, 1)
    return out_a, out_b


def _timed(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_gpulayer(args: argparse.Namespace, wheels: Path) -> dict[str, Any]:
    import gpulayer as gl
    from gpulayer.cluster import LocalCluster

    tmp = Path(tempfile.mkdtemp(prefix="gl-bench-envs-"))
    cache = Path(tempfile.mkdtemp(prefix="gl-bench-cache-"))
    out: dict[str, Any] = {"version": gl.__version__}
    try:
        cluster = LocalCluster(tmp, workers=1, slots=2, env={"GPULAYER_ENV_CACHE": str(cache)})
        with cluster:
            conn = cluster.connection()
            env = gl.Env([f"{PACKAGE}=={VERSION}"], find_links=[str(wheels)])

            def command(**kw: Any) -> Any:
                job = gl.submit(["true"], connection=conn, **kw).wait(timeout=300)
                if job.state != "succeeded":
                    raise RuntimeError(f"{job.id} {job.state}: {job.logs()}")
                return job

            for _ in range(args.warmup):
                command()
            t = time.perf_counter()
            cold = command(environment=env)
            cold_s = time.perf_counter() - t
            built = conn.job(cold.id).environment
            plain, hits = _paired(command, lambda: command(environment=env), args.samples)
            hit_report = conn.job(command(environment=env).id).environment
            out["command"] = {
                "no_env_p50_ms": _p50(plain),
                "cold_submit_to_done_s": cold_s,
                "cold_build_s": built.build_seconds if built else None,
                "hit_p50_ms": _p50(hits),
                "hit_overhead_ms": _p50(hits) - _p50(plain),
                "hit_was_cached": bool(hit_report and hit_report.cached),
            }

            @gl.remote(connection=conn)
            def plain_fn() -> int:
                return 1

            @gl.remote(connection=conn, environment=env)
            def env_fn() -> str:
                import glbench  # type: ignore[import-not-found]

                return str(glbench.VALUE)

            second = gl.Env([f"{PACKAGE}=={VERSION}", "glbench2==1.0"], find_links=[str(wheels)])

            @gl.remote(connection=conn, environment=second)
            def cold_fn() -> str:
                import glbench2  # type: ignore[import-not-found]

                return str(glbench2.VALUE)

            for _ in range(args.warmup):
                plain_fn.run()
                env_fn.run()
            fn_plain, fn_hits = _paired(plain_fn.run, env_fn.run, args.samples)
            t = time.perf_counter()
            cold_fn.run()
            out["function"] = {
                "no_env_p50_ms": _p50(fn_plain),
                "hit_p50_ms": _p50(fn_hits),
                "hit_overhead_ms": _p50(fn_hits) - _p50(fn_plain),
                "cold_first_call_s": time.perf_counter() - t,
            }
            conn.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return out


def bench_ray(args: argparse.Namespace, wheels: Path) -> dict[str, Any]:
    import ray

    out: dict[str, Any] = {"version": ray.__version__}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote
        def plain() -> int:
            return 1

        @ray.remote
        def with_env() -> str:
            import glbench  # type: ignore[import-not-found]

            return str(glbench.VALUE)

        for _ in range(args.warmup):
            ray.get(plain.remote())
        base = _timed(lambda: ray.get(plain.remote()), args.samples)
        out["task"] = {"no_env_p50_ms": _p50(base)}
        links = ["--find-links", str(wheels)]
        for kind, env in (
            ("pip", {"pip": {"packages": [f"{PACKAGE}=={VERSION}"],
                             "pip_install_options": links}}),
            ("uv", {"uv": {"packages": [f"{PACKAGE}=={VERSION}"],
                           "uv_pip_install_options": links}}),
        ):  # fmt: skip
            f = with_env.options(runtime_env=env)
            t = time.perf_counter()
            ray.get(f.remote())
            cold = time.perf_counter() - t
            hits = _timed(lambda f=f: ray.get(f.remote()), args.samples)
            out[kind] = {
                "cold_first_call_s": cold,
                "hit_p50_ms": _p50(hits),
                "hit_overhead_ms": _p50(hits) - _p50(base),
            }
    finally:
        ray.shutdown()
    return out


def _child(args: argparse.Namespace) -> None:
    wheels = Path(args.wheels)
    fn = {"gpulayer": bench_gpulayer, "ray": bench_ray}[args.system]
    print(json.dumps(fn(args, wheels)))


def _run_system(name: str, args: argparse.Namespace, wheels: Path) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--system", name, "--wheels", str(wheels),
            "--samples", str(args.samples), "--warmup", str(args.warmup)]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 1800 s"}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _table(r: dict[str, dict[str, Any]]) -> str:
    g, ray = r.get("gpulayer", {}), r.get("ray", {})
    rows = ["| | gpulayer | Ray pip | Ray uv |", "|---|---|---|---|"]

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:.1f} ms"

    def s(v: Any) -> str:
        return "-" if v is None else f"{v:.2f} s"

    gc, gf = g.get("command", {}), g.get("function", {})
    rp, ru = ray.get("pip", {}), ray.get("uv", {})
    rows += [
        f"| command: no env (p50) | {ms(gc.get('no_env_p50_ms'))} | n/a | n/a |",
        f"| command: cold build, submit to done | {s(gc.get('cold_submit_to_done_s'))}"
        f" (build {s(gc.get('cold_build_s'))}) | n/a | n/a |",
        f"| command: cache hit (p50) | {ms(gc.get('hit_p50_ms'))} | n/a | n/a |",
        f"| command: cache-hit overhead | {ms(gc.get('hit_overhead_ms'))} | n/a | n/a |",
        f"| function/task: no env (p50) | {ms(gf.get('no_env_p50_ms'))}"
        f" | {ms(ray.get('task', {}).get('no_env_p50_ms'))} | (same) |",
        f"| function/task: cold build, first call | {s(gf.get('cold_first_call_s'))}"
        f" | {s(rp.get('cold_first_call_s'))} | {s(ru.get('cold_first_call_s'))} |",
        f"| function/task: cache hit (p50) | {ms(gf.get('hit_p50_ms'))}"
        f" | {ms(rp.get('hit_p50_ms'))} | {ms(ru.get('hit_p50_ms'))} |",
        f"| function/task: cache-hit overhead | {ms(gf.get('hit_overhead_ms'))}"
        f" | {ms(rp.get('hit_overhead_ms'))} | {ms(ru.get('hit_overhead_ms'))} |",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--wheels", help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", action="append", choices=SYSTEMS)
    parser.add_argument("--out", type=Path, default=RESULTS / "environments.json")
    args = parser.parse_args()
    if args.system:
        _child(args)
        return
    wheels = Path(tempfile.mkdtemp(prefix="gl-bench-wheels-"))
    os.chmod(wheels, 0o755)
    make_wheel(wheels, PACKAGE, VERSION)
    make_wheel(wheels, "glbench2", "1.0")
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in args.only or SYSTEMS:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = _run_system(name, args, wheels)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "note": "a shared 2-core machine: other engineers ran tests at the same time",
        },
        "params": {
            "samples": args.samples,
            "warmup": args.warmup,
            "requirement": f"{PACKAGE}=={VERSION} (a local wheel, find_links)",
        },
        "results": results,
    }
    write_results(
        args.out,
        doc,
        "# Environments: gpulayer beside Ray's runtime_env\n\n"
        "`PYTHONPATH=$PWD /work/bench-venv/bin/python benchmarks/environments.py`"
        f" ({args.samples} samples, {args.warmup} warm-up); the machine is shared with"
        " other engineers running tests, so absolute times are noisy.\n\n"
        f"{_table(results)}\n",
    )


if __name__ == "__main__":
    main()
