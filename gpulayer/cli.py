"""The ``gpulayer`` command line.

::

    gpulayer up                       control plane + a local worker on this machine
    gpulayer join URL --token T       run a worker that serves URL
    gpulayer submit [-f] -- CMD ...   submit a command; -f streams its output
    gpulayer jobs | job ID | logs ID [-f] | cancel ID | artifacts ID [--download DIR]
    gpulayer workers
    gpulayer sessions | session end NAME   persistent remote kernels (%%gpulayer --session)
    gpulayer token create NAME --role ROLE [--expires 30d] | token list | token revoke NAME
    gpulayer demo                     a tour on a throw-away local cluster

The connection comes from ``--url``/``--token``, else ``GPULAYER_URL`` /
``GPULAYER_TOKEN``, else the file ``gpulayer up`` saved. Every error is one line
``gpulayer: error: ...`` on stderr: exit 2 for bad usage, 1 otherwise, 130 on Ctrl-C.
"""

import argparse
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from gpulayer import __version__, cells, client, config, contracts, errors, token_cli

if TYPE_CHECKING:
    from gpulayer.cluster import LocalCluster

_STDERR_STREAMS = (contracts.LogStream.stderr, contracts.LogStream.system)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors become one gpulayer error line."""

    def error(self, message: str) -> NoReturn:
        raise errors.ValidationError(f"{message} (see `{self.prog} --help`)")


# ------------------------------------------------------------------ parsing


def _duration(text: str) -> float:
    try:
        return contracts.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _default_data_dir() -> Path:
    if os.environ.get("GPULAYER_DATA_DIR"):
        return Path(os.environ["GPULAYER_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "gpulayer"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpulayer`` command."""
    conn = _Parser(add_help=False)
    conn.add_argument("--url", default=argparse.SUPPRESS, help="control plane URL")
    conn.add_argument("--token", default=argparse.SUPPRESS, help="gpulayer token")
    conn.add_argument("--fingerprint", default=argparse.SUPPRESS, metavar="sha256:...",
                      help="pinned TLS certificate (`gpulayer up` prints it)")  # fmt: skip
    parser = _Parser(prog="gpulayer", parents=[conn], description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gpulayer {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start a control plane and local workers here")
    up.add_argument("--port", type=int, help="port (default: 8765, or a free one if taken)")
    up.add_argument("--host", default="127.0.0.1", help="address to listen on")
    up.add_argument("--data-dir", type=Path, default=None,
                    help="default: $GPULAYER_DATA_DIR or ~/.local/share/gpulayer")  # fmt: skip
    up.add_argument("--local-workers", type=int, default=1, metavar="N")
    up.add_argument("--simulated-gpus", metavar="SPEC", help="e.g. 2xA100-80GB")
    up.add_argument("--slots", type=int, default=4, help="tasks per local worker")
    up.add_argument("--tls", action="store_true",
                    help="serve HTTPS (always on when --host is not loopback)")  # fmt: skip
    up.add_argument("--certfile", type=Path, help="serve this certificate, not a self-signed one")
    up.add_argument("--keyfile", type=Path, help="the key of --certfile")
    up.add_argument("--no-save-config", action="store_true",
                    help="do not save the connection for gl.connect()")  # fmt: skip
    up.set_defaults(func=_cmd_up)

    join = sub.add_parser("join", help="run a worker for the control plane at URL")
    join.add_argument("join_url", metavar="URL")
    join.add_argument("--token", default=os.environ.get("GPULAYER_JOIN_TOKEN"),
                      required=not os.environ.get("GPULAYER_JOIN_TOKEN"),
                      help="the join token `gpulayer up` printed")  # fmt: skip
    join.add_argument("--fingerprint", default=os.environ.get("GPULAYER_FINGERPRINT"),
                      metavar="sha256:...", help="pin the server's TLS certificate")  # fmt: skip
    join.add_argument("--name", help="worker name (default: the hostname)")
    join.add_argument("--slots", type=int, default=4, help="tasks run at once")
    join.add_argument("--address", metavar="HOST",
                      help="where other workers reach this one for distributed jobs"
                           " (default: the IP used to reach the control plane)")  # fmt: skip
    join.add_argument("--data-dir", type=Path, default=None)
    join.add_argument("--label", type=_key_value, action="append", default=[], metavar="K=V")
    join.add_argument("--warm-runners", type=int, default=1, metavar="N",
                      help="Python function runners started ahead of the first call")  # fmt: skip
    join.add_argument("--runner-max-calls", type=int, default=1000, metavar="N",
                      help="calls before a function runner is replaced by a fresh one")  # fmt: skip
    join.set_defaults(func=_cmd_join)

    s = sub.add_parser("submit", parents=[conn], help="submit a command",
                       usage="gpulayer submit [options] -- CMD [ARG ...]")  # fmt: skip
    s.add_argument("--gpus", type=int, default=0)
    s.add_argument("--cpus", type=float, default=1.0)
    s.add_argument("--memory", help="host memory, e.g. 8GiB")
    s.add_argument("--gpu-memory", metavar="SIZE", help="memory of each GPU, e.g. 40GiB")
    s.add_argument("--gpu-model", metavar="REGEX", help="GPU name pattern, e.g. 'A100|H100'")
    s.add_argument("--accelerator", choices=["cuda", "rocm", "mps", "cpu"])
    s.add_argument("--min-compute-capability", metavar="X.Y", help="e.g. 8.0")
    s.add_argument("--gpu-memory-kind", choices=["dedicated", "unified"])
    s.add_argument(
        "--selector",
        type=_key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="worker label that must match (repeatable)",
    )
    s.add_argument("--worker", metavar="NAME", help="run only on this worker")
    s.add_argument(
        "--profile", choices=list(contracts.PROFILES), help="a shorthand requirement set"
    )
    s.add_argument("--timeout", type=_duration, help="e.g. 90s, 10m, 2h")
    s.add_argument("--retries", type=int, default=0)
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--name")
    s.add_argument("--workdir", type=Path, help="directory shipped as the task's cwd")
    s.add_argument("--env", type=_key_value, action="append", default=[], metavar="K=V")
    s.add_argument("--label", type=_key_value, action="append", default=[], metavar="K=V")
    s.add_argument("--shell", metavar="'CMD | CMD'", help="run a string with /bin/sh -c")
    s.add_argument("--nodes", type=int, default=1,
                   help="distributed: nodes (one task per worker) started by torchrun")  # fmt: skip
    s.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="distributed: processes per node")  # fmt: skip
    s.add_argument("--launcher", choices=["torchrun", "direct"], default="torchrun",
                   help="distributed: torchrun, or gpulayer starting the ranks itself")  # fmt: skip
    s.add_argument("-f", "--follow", action="store_true", help="stream output, exit like it")
    s.add_argument("command", nargs="*", metavar="CMD", help="argv, after `--`")
    s.set_defaults(func=_cmd_submit)

    jobs = sub.add_parser("jobs", parents=[conn], help="list jobs")
    jobs.add_argument("--state", choices=[str(s) for s in contracts.JobState])
    jobs.add_argument("--limit", type=int, default=50)
    jobs.set_defaults(func=_cmd_jobs)

    for name, func, text in (
        ("job", _cmd_job, "show one job, its tasks and events"),
        ("cancel", _cmd_cancel, "cancel a job"),
        ("explain", _cmd_explain, "why a job runs where it does, or waits"),
    ):
        p = sub.add_parser(name, parents=[conn], help=text)
        p.add_argument("job_id", metavar="ID")
        p.set_defaults(func=func)
    for name, text in (("drain", "finish a worker's tasks, give it no new ones"),
                       ("resume", "give a drained worker tasks again")):  # fmt: skip
        p = sub.add_parser(name, parents=[conn], help=text)
        p.add_argument("worker", metavar="NAME")
        p.set_defaults(func=_cmd_drain)

    logs = sub.add_parser("logs", parents=[conn], help="print a job's output")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    logs.add_argument("--rank", type=int, metavar="N", help="only the lines of global rank N")
    logs.set_defaults(func=_cmd_logs)

    sub.add_parser("workers", parents=[conn], help="list workers").set_defaults(func=_cmd_workers)

    arts = sub.add_parser("artifacts", parents=[conn], help="list or download artifacts")
    arts.add_argument("job_id", metavar="ID")
    arts.add_argument("--download", type=Path, metavar="DIR")
    arts.set_defaults(func=_cmd_artifacts)

    sub.add_parser("sessions", parents=[conn], help="list sessions (persistent remote kernels)"
                   ).set_defaults(func=_cmd_sessions)  # fmt: skip
    session = sub.add_parser("session", help="end a session")
    session_verbs = session.add_subparsers(dest="session_cmd", required=True, metavar="VERB")
    end = session_verbs.add_parser("end", parents=[conn], help="stop its kernel, free its GPUs")
    end.add_argument("name", metavar="NAME")
    end.set_defaults(func=_cmd_session_end)

    sub.add_parser("demo", help="a tour on a throw-away local cluster").set_defaults(func=_cmd_demo)
    token_cli.add_parsers(sub, conn)
    return parser


# ------------------------------------------------------------------ running


def main(argv: Sequence[str] | None = None, *, connection: client.Connection | None = None) -> int:
    """Run the ``gpulayer`` command; returns the exit code.

    Parameters
    ----------
    argv
        Arguments without the program name (default: ``sys.argv[1:]``).
    connection
        Use this connection instead of resolving ``--url``/``--token`` (for
        embedding and tests).
    """
    try:
        args = _parse(build_parser(), argv)
        args.connection = connection
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except errors.GpulayerError as e:
        return _fail(e.message, 2 if isinstance(e, errors.ValidationError) else 1)
    except (OSError, TimeoutError) as e:
        return _fail(str(e) or type(e).__name__, 1)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if args.cmd == "submit":
            hint = "; put the command after `--`, e.g. gpulayer submit -- python -c 'print(1)'"
        raise errors.ValidationError(f"unrecognized arguments: {shlex.join(extra)}{hint}")
    return args


def _fail(message: str, code: int) -> int:
    first, *rest = message.strip().splitlines() or ["failed"]
    print(f"gpulayer: error: {first}", file=sys.stderr)
    for line in rest:  # e.g. the log tail of a control plane that did not start
        print(f"  {line}", file=sys.stderr)
    return code


def _connect(args: argparse.Namespace) -> client.Connection:
    if args.connection is not None:
        return args.connection  # type: ignore[no-any-return]
    cfg = config.resolve(
        getattr(args, "url", None), getattr(args, "token", None), getattr(args, "fingerprint", None)
    )
    return client.Connection(cfg.url, cfg.token, fingerprint=cfg.fingerprint)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _cmd_up(args: argparse.Namespace) -> int:
    # only `up` and `demo` need subprocesses
    from gpulayer.cluster import LocalCluster, preferred_port

    data_dir = (args.data_dir or _default_data_dir()).expanduser().resolve()
    port = args.port if args.port is not None else preferred_port(args.host)
    cluster = LocalCluster(data_dir, port=port, host=args.host, workers=args.local_workers,
                           simulated_gpus=args.simulated_gpus, slots=args.slots,
                           tls=True if args.tls or args.certfile else None,
                           certfile=args.certfile, keyfile=args.keyfile)  # fmt: skip
    # SIGTERM stops us like Ctrl-C does, so `kill <pid>` also cleans up.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _note(f"starting the gpulayer control plane and {args.local_workers} local worker(s)"
              f" in {data_dir} ...")  # fmt: skip
        cluster.start()
        try:
            _print_up(cluster, args, data_dir)
            while True:
                time.sleep(0.5)
                cluster.check()
        except KeyboardInterrupt:
            _note("stopping gpulayer ...")
            return 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the shutdown finish
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            cluster.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _print_up(cluster: "LocalCluster", args: argparse.Namespace, data_dir: Path) -> None:
    url = cluster.url
    token_file = data_dir / "admin.token"
    remote_url = url
    if args.host in ("0.0.0.0", ""):
        import socket

        remote_url = url.replace("127.0.0.1", socket.getfqdn(), 1)
    saved = None
    if not args.no_save_config:
        saved = config.save(config.ConnectionConfig(url=url, token=cluster.admin_token,
                                                    fingerprint=cluster.fingerprint))  # fmt: skip
    pin = f" --fingerprint {cluster.fingerprint}" if cluster.fingerprint else ""
    print(f"control plane:   {url}")
    if cluster.fingerprint:
        print(f"TLS certificate: {cluster.fingerprint}")
    print(f"admin token:     {token_file}")
    print(f"local workers:   {', '.join(cluster.workers) or 'none'}")
    print(f"connection:      {'saved to ' + str(saved) if saved else 'not saved'}")
    print("join from another machine:")
    print(f"  gpulayer join {remote_url} --token {cluster.join_token}{pin}")
    if args.host.startswith("127.") or args.host in ("localhost", "::1"):
        print(
            f"  (listening on {args.host} only: use `gpulayer up --host 0.0.0.0` (TLS on)"
            " so other machines can reach it)"
        )
    print("use it from a notebook:")
    if saved:
        print("  import gpulayer as gl; gl.connect()")
    token_expr = f'open("{token_file}").read().strip()'
    fp = f', fingerprint="{cluster.fingerprint}"' if cluster.fingerprint else ""
    print(f'  import gpulayer as gl; gl.connect("{url}", token={token_expr}{fp})')
    print(f"gpulayer is up at {url}", flush=True)
    _note("press Ctrl-C to stop")


def _cmd_join(args: argparse.Namespace) -> int:
    try:
        from gpulayer.worker import AgentConfig
        from gpulayer.worker import main as agent_main
    except ImportError as e:
        raise errors.GpulayerError(f"the gpulayer worker agent cannot be loaded: {e}") from e
    cfg = AgentConfig(
        url=args.join_url, token=args.token, name=args.name, slots=args.slots,
        data_dir=args.data_dir, labels=dict(args.label), fingerprint=args.fingerprint,
        warm_runners=args.warm_runners, runner_max_calls=args.runner_max_calls,
        address=args.address,
    )  # fmt: skip
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    # httpx logs every request at INFO: one line per heartbeat and poll is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return int(agent_main(cfg))
    except ValueError as e:  # e.g. a malformed GPULAYER_SIMULATED_GPUS
        raise errors.ValidationError(str(e)) from e


def _cmd_submit(args: argparse.Namespace) -> int:
    if bool(args.command) == bool(args.shell):
        raise errors.ValidationError(
            "give a command after `--` (gpulayer submit -- python train.py)"
            " or a shell string with --shell 'cmd | cmd', not both"
            if args.command
            else "no command given; put it after `--` (gpulayer submit -- python train.py)"
            " or use --shell 'cmd | cmd'"
        )
    if len(args.command) == 1 and " " in args.command[0]:
        _note(f"note: running {args.command[0]!r} as one program; use --shell for shell syntax")
    conn = _connect(args)
    job = client.submit(
        args.shell if args.shell else args.command,
        gpus=args.gpus, cpus=args.cpus, memory=args.memory, timeout=args.timeout,
        gpu_memory=args.gpu_memory, gpu_model=args.gpu_model, accelerator=args.accelerator,
        min_compute_capability=args.min_compute_capability,
        gpu_memory_kind=args.gpu_memory_kind, selector=dict(args.selector),
        worker=args.worker, profile=args.profile,
        retries=args.retries, name=args.name, env=dict(args.env), workdir=args.workdir,
        labels=dict(args.label), priority=args.priority, connection=conn,
        nodes=args.nodes, nproc_per_node=args.nproc_per_node, launcher=args.launcher,
    )  # fmt: skip
    if not args.follow:
        print(job.id, flush=True)
        return 0
    _note(f"job {job.id} submitted; waiting for it to start ...")
    return _follow(conn, job.id)


def _print_line(line: contracts.LogLine, rank: int | None, decoder: cells.MessageDecoder) -> None:
    """Print one log line (``[rank] text`` for a gang's), unless another rank's.

    A cell's relayed messages print as their plain text.
    """
    if rank is not None and line.rank != rank:
        return
    text = cells.log_text(line, decoder)
    if text is None:
        return
    if line.rank is not None and rank is None:
        text = f"[{line.rank}] {text}"
    out = sys.stderr if line.stream in _STDERR_STREAMS else sys.stdout
    print(text, file=out, flush=True)


def _follow(conn: client.Connection, job_id: str, rank: int | None = None) -> int:
    """Stream a job's output until it ends; returns the exit code to mirror."""
    decoder = cells.MessageDecoder()
    try:
        for line in conn.follow_logs(job_id):
            _print_line(line, rank, decoder)
        job = conn.wait(job_id)
    except KeyboardInterrupt:
        _note(f"stopped following; job {job_id} keeps running (gpulayer cancel {job_id})")
        raise
    code = "" if job.exit_code is None else f" (exit {job.exit_code})"
    why = f": {job.reason}" if job.reason and job.state != contracts.JobState.succeeded else ""
    _note(f"job {job.id} {job.state} in {contracts.format_duration(job.duration)}{code}{why}")
    return _exit_status(job)


def _exit_status(job: contracts.Job) -> int:
    if job.state == contracts.JobState.succeeded:
        return 0
    code = job.exit_code
    if code is None or code == 0 or code > 255:
        return 1
    return 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell


def _cmd_jobs(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        jobs = conn.jobs(state=args.state, limit=args.limit)
    rows = [
        (j.id, j.spec.name or "-", str(j.state), j.worker_name or "-",
         "-" if j.exit_code is None else str(j.exit_code), _age(j.created_at),
         contracts.format_duration(j.duration))
        for j in jobs
    ]  # fmt: skip
    _table(("ID", "NAME", "STATE", "WORKER", "EXIT", "AGE", "DURATION"), rows)
    return 0


def _cmd_job(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        job = conn.job(args.job_id)
        events = conn.events(args.job_id)
    spec = job.spec
    program = spec.shell if spec.shell is not None else shlex.join(spec.command or [])
    res = spec.resources
    fields = [
        ("id", job.id), ("name", spec.name or "-"), ("state", str(job.state)),
        ("reason", job.reason or "-"), ("owner", job.owner), ("worker", job.worker_name or "-"),
        ("exit", "-" if job.exit_code is None else str(job.exit_code)),
        ("attempts", str(job.attempts)), ("command", program),
        ("resources", f"gpus={res.gpus} cpus={res.cpus:g}"
                      + (f" memory={res.memory.human_readable()}" if res.memory else "")),
        ("timeout", contracts.format_duration(spec.timeout)), ("retries", str(spec.retries)),
        ("created", _when(job.created_at)), ("started", _when(job.started_at)),
        ("ended", _when(job.ended_at)), ("duration", contracts.format_duration(job.duration)),
    ]  # fmt: skip
    for key, value in fields:
        print(f"{key + ':':<11}{value}")
    if job.pending_reasons:
        print("\nwhy it is waiting:")
        for reason in job.pending_reasons:
            print(f"  {reason}")
    if job.tasks:
        print("\ntasks:")
        _table(("TASK", "ATTEMPT", "STATE", "WORKER", "GPUS", "EXIT", "REASON"), [
            (t.id, str(t.attempt), str(t.state), t.worker_name or "-",
             ",".join(map(str, t.gpu_indices)) or "-",
             "-" if t.exit_code is None else str(t.exit_code), t.reason or "")
            for t in job.tasks
        ], indent="  ")  # fmt: skip
    if events:
        print("\nevents:")
        _table(("TIME", "STATE", "TASK", "REASON"), [
            (_when(e.ts), e.state, e.task_id or "", e.reason or "") for e in events
        ], indent="  ")  # fmt: skip
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        if args.follow:
            _follow(conn, args.job_id, args.rank)
            return 0
        offset = 0
        decoder = cells.MessageDecoder()
        while True:
            page = conn.logs(args.job_id, offset)
            for line in page.lines:
                _print_line(line, args.rank, decoder)
            if not page.lines or page.next_offset <= offset:
                return 0
            offset = page.next_offset


def _cmd_cancel(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        job = conn.cancel(args.job_id)
    print(f"{job.id} {job.state}")
    return 0


def _cmd_workers(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        workers = conn.workers()
    rows = [
        (w.name, str(w.state), str(w.slots), str(len(w.running_tasks)), _devices(w.devices),
         _gpu_use(w), str(w.cpus), _bytes(w.memory_bytes),
         _age(w.last_heartbeat) + (" ago" if w.last_heartbeat else ""))
        for w in workers
    ]  # fmt: skip
    _table(("NAME", "STATE", "SLOTS", "RUNNING", "DEVICES", "GPU USE", "CPUS", "MEMORY",
            "HEARTBEAT"), rows)  # fmt: skip
    return 0


def _cmd_sessions(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        sessions = conn.sessions()
    rows = [
        (s.name, str(s.state), s.owner, s.worker_name or "-",
         ",".join(map(str, s.gpu_indices)) or "-", str(s.cells), _age(s.created_at),
         contracts.format_duration(s.idle_timeout))
        for s in sessions
    ]  # fmt: skip
    _table(("NAME", "STATE", "OWNER", "WORKER", "GPUS", "CELLS", "AGE", "IDLE TIMEOUT"), rows)
    return 0


def _cmd_session_end(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        conn.end_session(args.name)
    print(f"session {args.name} ended")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        p = conn.placement(args.job_id)
    print(f"job {p.job_id} is {p.state}: {p.summary}")
    rows = [(w.worker, "yes" if w.fits else "no", "yes" if w.could_ever_fit else "never",
             w.reason) for w in p.workers]  # fmt: skip
    if rows:
        _table(("WORKER", "FITS NOW", "COULD FIT", "WHY"), rows)
    return 0 if p.satisfiable else 1


def _cmd_drain(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        w = conn.drain(args.worker, resume=args.cmd == "resume")
    running = f"; {len(w.running_tasks)} task(s) still running" if w.running_tasks else ""
    print(f"worker {w.name} is {w.state}{running}")
    return 0


def _cmd_artifacts(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        if args.download is not None:
            for path in conn.download(args.job_id, args.download):
                print(path)
            return 0
        arts = conn.artifacts(args.job_id)
    _table(("NAME", "SIZE", "SHA256"), [(a.name, _bytes(a.size), a.sha256[:12]) for a in arts])
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpulayer import demo

    return demo.main()


# ---------------------------------------------------------------- rendering


def _gpu_use(w: contracts.Worker) -> str:
    """``0:35% 12.0GiB 1:-`` from the latest heartbeat ('-' while unknown)."""
    if not w.gpus:
        return "-"
    parts = []
    for g in w.gpus:
        util = "-" if g.utilization_percent is None else f"{g.utilization_percent:.0f}%"
        mem = "" if g.memory_used_bytes is None else f" {_bytes(g.memory_used_bytes)}"
        parts.append(f"{g.index}:{util}{mem}")
    return " ".join(parts)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> None:
    rows = list(rows)
    if not rows:
        print(f"{indent}(none)")
        return
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    for row in (headers, *rows):
        cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        print(indent + "  ".join(cells).rstrip())


def _age(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    return contracts.format_duration(max((datetime.now(UTC) - ts).total_seconds(), 0.001))


def _when(ts: datetime | None) -> str:
    return "-" if ts is None else ts.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{n}B"


def _devices(devices: Sequence[contracts.Device]) -> str:
    counts: dict[str, int] = {}
    for d in devices:
        if d.kind == "cpu":
            continue
        label = d.name + (" (sim)" if d.simulated and "simulated" not in d.name.lower() else "")
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n}x {label}" for label, n in counts.items()) or "-"
