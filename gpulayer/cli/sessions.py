"""``gpulayer sessions | session end NAME``: persistent remote kernels."""

import argparse
from typing import Any

from gpulayer import contracts
from gpulayer.cli import output
from gpulayer.cli.options import connect, examples, output_options


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add the session commands to the ``gpulayer`` parser."""
    sub.add_parser("sessions", parents=[conn, output_options()],
                   help="list sessions (persistent remote kernels)",
                   epilog=examples("gpulayer sessions", "gpulayer sessions -o json"),
                   ).set_defaults(func=_sessions)  # fmt: skip
    session = sub.add_parser("session", help="end a session",
                             epilog=examples("gpulayer session end train"))  # fmt: skip
    verbs = session.add_subparsers(dest="session_cmd", required=True, metavar="VERB")
    end = verbs.add_parser("end", parents=[conn], help="stop its kernel, free its GPUs",
                           epilog=examples("gpulayer session end train"))  # fmt: skip
    end.add_argument("name", metavar="NAME", help="the session's name (%%gpulayer --session)")
    end.set_defaults(func=_end)


def _sessions(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        sessions = conn.sessions()
    if args.output == "json":
        output.document(contracts.SessionList(sessions=sessions))
        return 0
    rows = [
        (s.name, str(s.state), s.owner, s.worker_name or "-",
         ",".join(map(str, s.gpu_indices)) or "-", str(s.cells), output.age(s.created_at),
         contracts.format_duration(s.idle_timeout))
        for s in sessions
    ]  # fmt: skip
    output.table(("NAME", "STATE", "OWNER", "WORKER", "GPUS", "CELLS", "AGE", "IDLE TIMEOUT"), rows)
    return 0


def _end(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        conn.end_session(args.name)
    print(f"session {args.name} ended")
    return 0
