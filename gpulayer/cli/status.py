"""``gpulayer status`` (is it up: the control plane, its workers, the queue) and
``gpulayer down`` (stop the ``gpulayer up`` of a data dir, by the PID it recorded)."""

import argparse
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from gpulayer import contracts, errors
from gpulayer.cli import output, pidfile
from gpulayer.cli.options import connect, examples, output_options
from gpulayer.cli.up import default_data_dir
from gpulayer.cli.workers import devices

#: How long ``down`` waits for ``up`` to stop its workers and control plane.
DOWN_DEADLINE_SECONDS = 60.0
#: Jobs counted per state in the queue summary (more read "1000+").
_COUNTED = 1000
_ACTIVE = (contracts.JobState.queued, contracts.JobState.scheduled, contracts.JobState.running)


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add ``status`` and ``down`` to the ``gpulayer`` parser."""
    st = sub.add_parser(
        "status", parents=[conn, output_options()],
        help="is the control plane up: its workers and queue (exit 0 when up)",
        epilog=examples("gpulayer status", "gpulayer status --url https://gpu.example.org/",
                        "until gpulayer status >/dev/null; do sleep 1; done"),
    )  # fmt: skip
    st.set_defaults(func=_status)
    down = sub.add_parser(
        "down", help="stop the `gpulayer up` running for a data dir",
        epilog=examples("gpulayer down", "gpulayer down --data-dir /srv/gpulayer"),
    )  # fmt: skip
    down.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                      help="the data dir `gpulayer up` was given (default: as for up)")  # fmt: skip
    down.set_defaults(func=_down)


def _status(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        try:
            health = conn.health()
        except errors.ConnectionFailed as e:
            if args.output == "json":
                output.document({"url": conn.url, "up": False, "error": e.message})
                return 1
            raise
        workers = conn.workers()
        queue = {str(s): _count(conn.jobs(state=str(s), limit=_COUNTED)) for s in _ACTIVE}
    if args.output == "json":
        output.document({"url": conn.url, "up": True, "health": health,
                         "workers": workers, "jobs": queue})  # fmt: skip
        return 0
    output.say(f"gpulayer {health.version} is up at {conn.url}")
    ready = sum(w.state == contracts.WorkerState.ready for w in workers)
    output.say(f"workers: {ready} of {len(workers)} ready")
    if workers:
        output.table(("NAME", "STATE", "RUNNING", "DEVICES"), [
            (w.name, str(w.state), f"{len(w.running_tasks)}/{w.slots}", devices(w.devices))
            for w in workers
        ], indent="  ")  # fmt: skip
    if not ready:
        output.say("  no worker is ready: run `gpulayer join URL` on a machine with GPUs")
    output.say("jobs: " + ", ".join(f"{n} {state}" for state, n in queue.items()))
    return 0


def _count(jobs: list[contracts.Job]) -> int | str:
    return f"{_COUNTED}+" if len(jobs) >= _COUNTED else len(jobs)


def _down(args: argparse.Namespace) -> int:
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    rec = pidfile.running(data_dir)
    if rec is None:
        raise errors.GpulayerError(f"no `gpulayer up` is running for {data_dir}")
    output.note(f"stopping gpulayer up (pid {rec.pid}, {rec.url}) ...")
    # SIGTERM stops `up` as Ctrl-C does: its workers first, then the control plane.
    with contextlib.suppress(ProcessLookupError):  # it stopped by itself meanwhile
        os.kill(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_DEADLINE_SECONDS
    while pidfile.alive(rec):
        if time.monotonic() > deadline:
            raise errors.GpulayerError(
                f"gpulayer up (pid {rec.pid}) did not stop within {DOWN_DEADLINE_SECONDS:g}s"
            )
        time.sleep(0.1)
    output.say(f"gpulayer up (pid {rec.pid}) in {data_dir} stopped")
    return 0
