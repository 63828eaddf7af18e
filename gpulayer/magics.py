"""IPython magics: ``%%gpulayer`` runs a cell on a worker, ``%gpulayer`` manages.

Load them with ``%load_ext gpulayer``. In a kernel started by a Jupyter server
that hosts the gpulayer extension this also connects to that server, with no
URL or token; elsewhere the connection comes from ``GPULAYER_URL`` /
``GPULAYER_TOKEN``, then the file ``gpulayer up`` saved, then
``%gpulayer connect URL --token T``.

The cell magic::

    %%gpulayer [--gpus N] [--gpu-memory 24GiB] [--worker NAME] [--session NAME]
               [--idle-timeout 30m] [--timeout 10m] [--push a,b] [--pull c,d] [--no-wait]

runs the cell in a headless kernel on a worker: a fresh one, or with
``--session NAME`` the session's persistent kernel (started on first use with
the given ``--gpus``/``--gpu-memory``/``--worker``), so variables survive from
cell to cell. What it prints streams into the cell while it runs; rich output
(images, HTML, figures, tables) renders as if local; a remote exception shows
the remote traceback marked with worker and job; the notebook's interrupt
button interrupts the remote cell (twice: cancels it). ``--push`` sends local
variables first and ``--pull`` brings variables back after it (cloudpickle:
same Python minor version on both sides). ``--no-wait`` returns the
:class:`~gpulayer.Job` at once.

With ``--nodes N`` / ``--nproc-per-node M`` (and ``--launcher direct``) the cell
is a distributed job instead: its source runs as a script (``__name__ ==
"__main__"``) on every rank of a gang of N workers x M processes, with
torchrun's variables set, so ``gpulayer.pytorch.Trainer`` or
``init_process_group`` work as in a script; ``--gpus``/``--gpu-memory`` are per
node. Every rank's output streams in as ``[rank] text``; the first rank that
raises fails the gang and its exception is raised here; ``--push`` variables
reach every rank and ``--pull`` brings back rank 0's. Rich output is not
relayed (it is a script, not a kernel) and ``--session`` does not apply.

The line magic::

    %gpulayer status | workers | jobs | sessions
    %gpulayer logs ID | cancel ID | end SESSION
    %gpulayer connect URL [--token T] [--fingerprint sha256:...]

Bad options raise :class:`~IPython.core.error.UsageError` with what to fix.
"""

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import clear_output, publish_display_data

from gpulayer import cells, client, config, contracts, errors
from gpulayer.jobs import Job

_IDENT = "a Python variable name"


def _duration(text: str) -> float:
    try:
        return contracts.parse_duration(text)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _names(text: str | None, option: str) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not n.isidentifier():
            raise UsageError(f"{option}: {n!r} is not {_IDENT}; give names like a,b")
    return names


class RemoteResult:
    """The remote cell's last value, shown as the local cell's ``Out[]``."""

    def __init__(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.data = data
        self.metadata = metadata

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", "<remote result>"))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict, dict]:
        return self.data, self.metadata


class Renderer:
    """Shows relayed messages in this kernel the way the remote kernel showed them."""

    def __init__(self) -> None:
        self.result: RemoteResult | None = None

    def __call__(self, msg: contracts.KernelMessage) -> None:
        c = msg.content
        kind = msg.msg_type
        if kind == "stream":
            out = sys.stderr if c.get("name") == "stderr" else sys.stdout
            out.write(str(c.get("text", "")))
            out.flush()  # the kernel's own stream batches; live output should not wait
        elif kind in ("display_data", "update_display_data"):
            publish_display_data(
                c.get("data", {}),
                c.get("metadata") or {},
                transient=msg.transient or None,
                **({"update": True} if kind == "update_display_data" else {}),
            )
        elif kind == "execute_result":
            self.result = RemoteResult(c.get("data", {}), c.get("metadata") or {})
        elif kind == "clear_output":
            clear_output(wait=bool(c.get("wait", False)))

    @staticmethod
    def line(line: contracts.LogLine) -> None:
        """gpulayer's own lines (a session starting, why a cell waits) go to stderr."""
        print(f"[gpulayer] {line.text}", file=sys.stderr, flush=True)


@magics_class
class GpulayerMagics(Magics):
    """``%%gpulayer`` and ``%gpulayer``; see the module docstring."""

    @magic_arguments()
    @argument("--gpus", type=int, default=0, help="whole GPUs (with --session: the session's)")
    @argument("--gpu-memory", metavar="SIZE", help="memory of each GPU, e.g. 24GiB")
    @argument("--worker", metavar="NAME", help="run on this worker only")
    @argument("--session", metavar="NAME", help="run in this persistent remote kernel")
    @argument("--idle-timeout", metavar="DURATION", help="a new session ends after this idle")
    @argument("--timeout", metavar="DURATION", help="the cell's time limit, e.g. 10m")
    @argument("--push", metavar="a,b", help="variables to send to the remote kernel first")
    @argument("--pull", metavar="c,d", help="variables to bring back afterwards")
    @argument("--no-wait", action="store_true", help="return the Job at once")
    @argument("--nodes", type=int, help="distributed: run the cell on N workers at once")
    @argument("--nproc-per-node", type=int, metavar="M", help="distributed: processes per node")
    @argument("--launcher", choices=["torchrun", "direct"], help="distributed: how ranks start")
    @cell_magic
    def gpulayer(self, line: str, cell: str) -> Any:
        """Run the cell in a remote kernel (see ``gpulayer.magics``)."""
        args = parse_argstring(self.gpulayer, line)
        return self._run_cell(args, cell)

    def _run_cell(self, args: Any, source: str) -> Any:
        if args.gpus < 0:
            raise UsageError("--gpus must be 0 or more")
        timeout = _duration(args.timeout) if args.timeout else None
        if args.idle_timeout:
            _duration(args.idle_timeout)
        if args.idle_timeout and not args.session:
            raise UsageError("--idle-timeout applies to a --session")
        push = _names(args.push, "--push")
        pull = _names(args.pull, "--pull")
        if pull and args.no_wait:
            raise UsageError("--pull needs the cell to finish here; drop --no-wait")
        ns = self.shell.user_ns
        missing = [n for n in push if n not in ns]
        if missing:
            raise UsageError(f"--push: {missing[0]!r} is not defined in this notebook")
        resources: dict[str, Any] = {"gpus": args.gpus, "cpus": 1}
        if args.gpu_memory:
            resources["gpu_memory"] = args.gpu_memory
        if args.worker:
            resources["worker"] = args.worker
        if args.nodes is not None or args.nproc_per_node is not None or args.launcher:
            if args.session:
                raise UsageError("--nodes runs the cell as a script on every rank; drop --session")
            values = {n: ns[n] for n in push}
            return self._run_gang(args, source, values, pull, timeout, resources)
        conn = connection()
        try:
            if args.session:
                cells.ensure_session(
                    conn, args.session, idle_timeout=args.idle_timeout, **resources
                )
                resources = {}
            run = cells.submit(
                conn, source, session=args.session, push={n: ns[n] for n in push},
                pull=pull, timeout=timeout, **resources,
            )  # fmt: skip
        except errors.ValidationError as e:
            raise UsageError(e.message) from e
        if args.no_wait:
            return Job(conn, run.info)
        renderer = Renderer()
        follow(run, renderer)
        values = run.result()  # raises the remote error (or JobFailed)
        ns.update(values)
        return renderer.result

    def _run_gang(
        self,
        args: Any,
        source: str,
        values: dict[str, Any],
        pull: list[str],
        timeout: float | None,
        resources: dict[str, Any],
    ) -> Any:
        """``%%gpulayer --nodes``: the cell as a distributed function of its source."""
        from gpulayer.functions import remote
        from gpulayer.worker.rank_call import run_source

        gang = {
            "nodes": 1 if args.nodes is None else args.nodes,
            "nproc_per_node": 1 if args.nproc_per_node is None else args.nproc_per_node,
        }
        conn = connection()
        try:
            fn = remote(
                run_source, name="cell", launcher=args.launcher or "torchrun",
                timeout=timeout, connection=conn, **gang, **resources,
            )  # fmt: skip
            if args.no_wait:
                return fn.spawn(source, values, pull).job
            pulled = fn.run(source, values, pull)  # raises the failing rank's exception
        except errors.ValidationError as e:
            raise UsageError(e.message) from e
        self.shell.user_ns.update(pulled)
        return None

    @magic_arguments()
    @argument("command", help="status, workers, jobs, sessions, logs, cancel, end, connect")
    @argument("target", nargs="?", help="job id (logs, cancel), session (end), URL (connect)")
    @argument("--token", help="with connect: a gpulayer token")
    @argument("--fingerprint", help="with connect: the server certificate's sha256")
    @line_magic("gpulayer")
    def gpulayer_line(self, line: str) -> Any:
        """Manage gpulayer from a notebook (see ``gpulayer.magics``)."""
        args = parse_argstring(self.gpulayer_line, line)
        command = _COMMANDS.get(args.command)
        if command is None:
            raise UsageError(
                f"unknown %gpulayer command {args.command!r}; one of {', '.join(_COMMANDS)}"
            )
        needs = _TARGETS.get(args.command)
        if needs and not args.target:
            raise UsageError(f"%gpulayer {args.command} needs {needs}")
        return command(args)


def follow(run: cells.CellRun, renderer: Renderer) -> None:
    """Render a cell's messages until it is done; the first Ctrl-C interrupts the
    remote cell (its traceback still shows), the second cancels it."""
    while True:
        try:
            for msg in run.messages(on_line=renderer.line):
                renderer(msg)
            break
        except KeyboardInterrupt:
            run.interrupt()  # raises KeyboardInterrupt the second time
    if run.interrupted:
        raise KeyboardInterrupt


def connection() -> client.Connection:
    """The notebook's connection; a UsageError that says how to connect when there is none."""
    try:
        return client.current_connection()
    except errors.ConfigError as e:
        raise UsageError(f"{e.message}; or run %gpulayer connect URL --token T") from e


# ------------------------------------------------------------ line commands


def _status(args: Any) -> None:
    conn = connection()
    h = conn.health()
    sessions = conn.sessions()
    print(f"connected to {conn.url} (gpulayer {h.version})")
    print(f"workers ready: {h.workers_ready}   jobs active: {h.jobs_active}"
          f"   sessions: {len(sessions)}")  # fmt: skip


def _workers(args: Any) -> Any:
    from gpulayer import widgets

    return widgets.WorkersTable(connection())


def _jobs(args: Any) -> None:
    rows = [
        (j.id, j.spec.kind, j.spec.name or "-", str(j.state), j.worker_name or "-",
         contracts.format_duration(j.duration))
        for j in connection().jobs(limit=20)
    ]  # fmt: skip
    _print_table(("ID", "KIND", "NAME", "STATE", "WORKER", "DURATION"), rows)


def _sessions(args: Any) -> None:
    rows = [
        (s.name, str(s.state), s.worker_name or "-", ",".join(map(str, s.gpu_indices)) or "-",
         str(s.cells), contracts.format_duration(s.idle_timeout))
        for s in connection().sessions()
    ]  # fmt: skip
    _print_table(("NAME", "STATE", "WORKER", "GPUS", "CELLS", "IDLE TIMEOUT"), rows)


def _logs(args: Any) -> None:
    conn = connection()
    decoder = cells.MessageDecoder()
    offset = 0
    while True:
        page = conn.logs(args.target, offset)
        for line in page.lines:
            text = cells.log_text(line, decoder)
            if text is not None:
                print(text)
        if not page.lines or page.next_offset <= offset:
            return
        offset = page.next_offset


def _cancel(args: Any) -> None:
    job = connection().cancel(args.target)
    print(f"{job.id} {job.state}")


def _end(args: Any) -> None:
    connection().end_session(args.target)
    print(f"session {args.target} ended")


def _connect(args: Any) -> None:
    try:
        conn = client.connect(args.target, args.token, fingerprint=args.fingerprint)
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


def _print_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    if not rows:
        print("(none)")
        return
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for r in [headers, *rows]:
        print("  ".join(v.ljust(widths[i]) for i, v in enumerate(r)).rstrip())


# ------------------------------------------------------------------ loading


def load(ipython: Any) -> None:
    """Register the magics and connect without ceremony where that is possible."""
    ipython.register_magics(GpulayerMagics)
    if client.default_connection() is not None:
        return
    parent = config.jupyter_parent()
    if parent is not None:
        try:
            client.connect(parent.url, parent.token)
            return
        except errors.GpulayerError:
            pass  # a Jupyter server without gpulayer: try the other ways
    try:
        client.connect()
    except errors.GpulayerError as e:
        print(f"gpulayer: not connected yet ({e.message}); use %gpulayer connect URL --token T",
              file=sys.stderr)  # fmt: skip
