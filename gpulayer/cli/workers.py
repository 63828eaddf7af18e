"""``gpulayer workers [forget NAME] | drain NAME | resume NAME``."""

import argparse
from collections.abc import Sequence
from typing import Any

from gpulayer import contracts
from gpulayer.cli import output
from gpulayer.cli.options import connect, examples, output_options


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add the worker commands to the ``gpulayer`` parser."""
    workers = sub.add_parser("workers", parents=[conn, output_options()], help="list workers",
                             epilog=examples("gpulayer workers", "gpulayer workers -o json",
                                             "gpulayer workers forget gpu-box-7"))  # fmt: skip
    workers.set_defaults(func=_workers)
    actions = workers.add_subparsers(dest="action", metavar="{forget}")
    forget = actions.add_parser(
        "forget",
        parents=[conn],
        help="forget a worker so its name may join again (admin)",
        epilog=examples("gpulayer workers forget gpu-box-7"),
    )
    forget.add_argument("worker", metavar="NAME", help="the worker's name")
    forget.set_defaults(func=_forget)
    for name, text in (("drain", "finish a worker's tasks, give it no new ones"),
                       ("resume", "give a drained worker tasks again")):  # fmt: skip
        p = sub.add_parser(name, parents=[conn], help=text,
                           epilog=examples(f"gpulayer {name} gpu-box-7"))  # fmt: skip
        p.add_argument("worker", metavar="NAME", help="the worker's name")
        p.set_defaults(func=_drain)


def _workers(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        workers = conn.workers()
    if args.output == "json":
        output.document(contracts.WorkerList(workers=workers))
        return 0
    rows = [
        (w.name, str(w.state), str(w.slots), str(len(w.running_tasks)), devices(w.devices),
         gpu_use(w), str(w.cpus), output.size(w.memory_bytes),
         output.age(w.last_heartbeat) + (" ago" if w.last_heartbeat else ""))
        for w in workers
    ]  # fmt: skip
    output.table(("NAME", "STATE", "SLOTS", "RUNNING", "DEVICES", "GPU USE", "CPUS", "MEMORY",
                  "HEARTBEAT"), rows)  # fmt: skip
    envs = [(w.name, e) for w in workers for e in w.envs]
    if envs:
        print("\ncached environments:")
        output.table(("WORKER", "KEY", "PACKAGES", "PYTHON", "SIZE", "IN USE", "LAST USED"), [
            (name, e.key[:12], str(e.packages), e.python or "-", output.size(e.size_bytes),
             str(e.in_use), output.age(e.last_used_at) + " ago")
            for name, e in envs
        ], indent="  ")  # fmt: skip
    return 0


def _forget(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        conn.forget_worker(args.worker)
    print(
        f"worker {args.worker} forgotten: its tokens are revoked, its tasks ended lost"
        " (retried while retries last), and a join token may register the name again"
    )
    return 0


def _drain(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        w = conn.drain(args.worker, resume=args.cmd == "resume")
    running = f"; {len(w.running_tasks)} task(s) still running" if w.running_tasks else ""
    output.say(f"worker {w.name} is {w.state}{running}")
    return 0


def gpu_use(w: contracts.Worker) -> str:
    """``0:35% 12.0GiB 1:-`` from the latest heartbeat ('-' while unknown)."""
    if not w.gpus:
        return "-"
    parts = []
    for g in w.gpus:
        util = "-" if g.utilization_percent is None else f"{g.utilization_percent:.0f}%"
        mem = "" if g.memory_used_bytes is None else f" {output.size(g.memory_used_bytes)}"
        parts.append(f"{g.index}:{util}{mem}")
    return " ".join(parts)


def devices(found: Sequence[contracts.Device]) -> str:
    """``2x NVIDIA A100 (sim)``: the worker's accelerators by name."""
    counts: dict[str, int] = {}
    for d in found:
        if d.kind == "cpu":
            continue
        label = d.name + (" (sim)" if d.simulated and "simulated" not in d.name.lower() else "")
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n}x {label}" for label, n in counts.items()) or "-"
