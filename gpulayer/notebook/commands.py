"""The ``%gpulayer`` line commands: status, workers, jobs, sessions, logs, cancel, end,
connect; and the notebook's connection."""

from typing import Any

from IPython.core.error import UsageError

from gpulayer import contracts, errors
from gpulayer.cli.output import table
from gpulayer.client import Connection, connect, current_connection
from gpulayer.client.cells import MessageDecoder, log_text
from gpulayer.client.logs import stored_lines


def connection() -> Connection:
    """The notebook's connection; a UsageError that says how to connect when there is none."""
    try:
        return current_connection()
    except errors.ConfigError as e:
        raise UsageError(f"{e.message}; or run %gpulayer connect URL --token T") from e


def run(command: str, args: Any) -> Any:
    """Run the line command ``command`` (its ``target`` checked first)."""
    fn = _COMMANDS.get(command)
    if fn is None:
        raise UsageError(f"unknown %gpulayer command {command!r}; one of {', '.join(_COMMANDS)}")
    needs = _TARGETS.get(command)
    if needs and not args.target:
        raise UsageError(f"%gpulayer {command} needs {needs}")
    return fn(args)


def _status(args: Any) -> None:
    conn = connection()
    h = conn.health()
    sessions = conn.sessions()
    print(f"connected to {conn.url} (gpulayer {h.version})")
    print(f"workers ready: {h.workers_ready}   jobs active: {h.jobs_active}"
          f"   sessions: {len(sessions)}")  # fmt: skip


def _workers(args: Any) -> Any:
    from gpulayer.notebook.widgets import WorkersTable

    return WorkersTable(connection())


def _jobs(args: Any) -> None:
    rows = [
        (j.id, j.spec.kind, j.spec.name or "-", str(j.state), j.worker_name or "-",
         contracts.format_duration(j.duration))
        for j in connection().jobs(limit=20)
    ]  # fmt: skip
    table(("ID", "KIND", "NAME", "STATE", "WORKER", "DURATION"), rows)


def _sessions(args: Any) -> None:
    rows = [
        (s.name, str(s.state), s.worker_name or "-", ",".join(map(str, s.gpu_indices)) or "-",
         str(s.cells), contracts.format_duration(s.idle_timeout))
        for s in connection().sessions()
    ]  # fmt: skip
    table(("NAME", "STATE", "WORKER", "GPUS", "CELLS", "IDLE TIMEOUT"), rows)


def _logs(args: Any) -> None:
    decoder = MessageDecoder()
    for line in stored_lines(connection(), args.target):
        text = log_text(line, decoder)
        if text is not None:
            print(text)


def _cancel(args: Any) -> None:
    job = connection().cancel(args.target)
    print(f"{job.id} {job.state}")


def _end(args: Any) -> None:
    connection().end_session(args.target)
    print(f"session {args.target} ended")


def _connect(args: Any) -> None:
    try:
        insecure = bool(getattr(args, "insecure", False))
        conn = connect(args.target, args.token, fingerprint=args.fingerprint, insecure=insecure)
    except errors.ConfigError as e:
        raise UsageError(e.message) from e
    print(f"connected to {conn.url}")


_COMMANDS = {
    "status": _status,
    "workers": _workers,
    "jobs": _jobs,
    "sessions": _sessions,
    "logs": _logs,
    "cancel": _cancel,
    "end": _end,
    "connect": _connect,
}
_TARGETS = {"logs": "a job id", "cancel": "a job id", "end": "a session name", "connect": "a URL"}
