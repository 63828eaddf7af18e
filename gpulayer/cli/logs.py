"""``gpulayer logs ID [-f] [--rank N] [--attempt N] [--raw]``, and following a job's
output until it ends.

A job's output is printed through :func:`gpulayer.cli.output.plain` (no terminal
control sequences) unless ``--raw``.
"""

import argparse
import sys
from typing import Any

from gpulayer import contracts
from gpulayer.cli import output
from gpulayer.cli.options import bounded, connect, examples
from gpulayer.client import Connection
from gpulayer.client.cells import MessageDecoder, log_text
from gpulayer.client.logs import stored_lines, with_attempt_marks
from gpulayer.client.pending import wait_to_start

_STDERR_STREAMS = (contracts.LogStream.stderr, contracts.LogStream.system)
RAW_HELP = "print the output as it is, terminal control sequences included"


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add ``logs`` to the ``gpulayer`` parser."""
    logs = sub.add_parser("logs", parents=[conn], help="print a job's output",
                          epilog=examples("gpulayer logs 3f2a9c81d0e4",
                                          "gpulayer logs -f 3f2a9c81d0e4   # until it ends",
                                          "gpulayer logs 3f2a9c81d0e4 --rank 0"))  # fmt: skip
    logs.add_argument("job_id", metavar="ID", help="the job's id")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    logs.add_argument("--rank", type=bounded(int, 0), metavar="N",
                      help="only the lines of global rank N")  # fmt: skip
    logs.add_argument("--attempt", type=bounded(int, 1), metavar="N",
                      help="only the lines of attempt N (1 is the first)")  # fmt: skip
    logs.add_argument("--raw", action="store_true", help=RAW_HELP)
    logs.set_defaults(func=_logs)


def _logs(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        if args.follow:
            follow(conn, args.job_id, args.rank, attempt=args.attempt, raw=args.raw)
            return 0
        decoder = MessageDecoder()
        lines = stored_lines(conn, args.job_id, attempt=args.attempt)
        if args.attempt is None:
            lines = with_attempt_marks(conn, args.job_id, lines)
        for line in lines:
            print_line(line, args.rank, decoder, raw=args.raw)
    return 0


def print_line(
    line: contracts.LogLine, rank: int | None, decoder: MessageDecoder, *, raw: bool = False
) -> None:
    """Print one log line (``[rank] text`` for a gang's), unless another rank's.

    A cell's relayed messages print as their plain text; terminal control
    sequences are stripped unless ``raw``.
    """
    if rank is not None and line.rank != rank:
        return
    text = log_text(line, decoder)
    if text is None:
        return
    if line.rank is not None and rank is None:
        text = f"[{line.rank}] {text}"
    out = sys.stderr if line.stream in _STDERR_STREAMS else sys.stdout
    output.say(text, raw=raw, file=out)


def follow(
    conn: Connection,
    job_id: str,
    rank: int | None = None,
    *,
    attempt: int | None = None,
    raw: bool = False,
) -> int:
    """Stream a job's output (only attempt ``attempt``'s when given) until it ends,
    riding through control-plane restarts; returns the exit code to mirror. While the
    job is queued it says why (within ~2 s, and again when the reason changes)."""
    decoder = MessageDecoder()
    lines = conn.follow_logs(job_id, attempt=attempt)
    if attempt is None:
        lines = with_attempt_marks(conn, job_id, lines)
    try:
        wait_to_start(conn, conn.job(job_id), output.note)
        for line in lines:
            print_line(line, rank, decoder, raw=raw)
        job = conn.wait(job_id)
    except KeyboardInterrupt:
        output.note(f"stopped following; job {job_id} keeps running (gpulayer cancel {job_id})")
        raise
    code = "" if job.exit_code is None else f" (exit {job.exit_code})"
    why = f": {job.reason}" if job.reason and job.state != contracts.JobState.succeeded else ""
    took = "" if job.duration is None else f" in {contracts.format_duration(job.duration)}"
    output.note(f"job {job.id} {job.state}{took}{code}{why}")
    return exit_status(job)


def exit_status(job: contracts.Job) -> int:
    """The exit status that mirrors how ``job`` ended, like a shell's."""
    if job.state == contracts.JobState.succeeded:
        return 0
    code = job.exit_code
    if code is None or code == 0 or code > 255:
        return 1
    return 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell
