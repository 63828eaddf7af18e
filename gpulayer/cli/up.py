"""``gpulayer up`` (a control plane and local workers here), ``gpulayer join URL``
(a worker for a control plane) and ``gpulayer demo``."""

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer import contracts, errors, paths
from gpulayer.cli import output, pidfile
from gpulayer.cli.options import bounded, examples
from gpulayer.client import config
from gpulayer.client.specs import key_value
from gpulayer.notebook import progress

if TYPE_CHECKING:
    from gpulayer.cli.cluster import LocalCluster


TASK_USER_HELP = (
    "who runs tasks when the worker is root (default: gpulayer-task, created when missing;"
    " '' runs them as the worker's own user, which can read its data dir)"
)


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add ``up``, ``join`` and ``demo`` to the ``gpulayer`` parser."""
    up = sub.add_parser("up", help="start a control plane and local workers here",
                        epilog=examples(
                            "gpulayer up                                # one CPU-only worker",
                            "gpulayer up --simulated-gpus 2xA100-80GB   # try GPU jobs on a laptop",
                            "gpulayer up --host 0.0.0.0 --local-workers 0   # workers join from"
                            " elsewhere",
                            "gpulayer up --local-workers 0 --providers slurm.toml   # workers"
                            " on demand",
                            "gpulayer down                              # stop it again",
                        ))  # fmt: skip
    up.add_argument("--port", type=bounded(int, 1, 65535),
                    help="port (default: 8765, or a free one if taken)")  # fmt: skip
    up.add_argument("--host", default="127.0.0.1", help="address to listen on")
    up.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                    help="default: $GPULAYER_DATA_DIR, else <Jupyter data dir>/gpulayer"
                         " (~/.local/share/jupyter/gpulayer on Linux)")  # fmt: skip
    up.add_argument("--local-workers", type=bounded(int, 0), default=1, metavar="N",
                    help="workers started here (default 1, named local-1, ...)")  # fmt: skip
    up.add_argument("--simulated-gpus", metavar="SPEC",
                    help="give the local workers simulated GPUs, e.g. 2xA100-80GB")  # fmt: skip
    up.add_argument("--slots", type=bounded(int, 1), default=4, help="tasks per local worker")
    up.add_argument("--tls", action="store_true",
                    help="serve HTTPS (always on when --host is not loopback)")  # fmt: skip
    up.add_argument("--certfile", type=Path, help="serve this certificate, not a self-signed one")
    up.add_argument("--keyfile", type=Path, help="the key of --certfile")
    up.add_argument(
        "--heartbeat-seconds",
        type=float,
        metavar="S",
        help="how often workers heartbeat (default 2; unhealthy after 3 missed)",
    )
    up.add_argument(
        "--lease-seconds",
        type=float,
        metavar="S",
        help="a silent worker's running tasks are retried after this long"
        " (default 12; workers stop them at lease - 2 x heartbeat)",
    )
    up.add_argument("--no-save-config", action="store_true",
                    help="do not save the connection for gl.connect()")  # fmt: skip
    up.add_argument("--task-user", metavar="NAME", help=TASK_USER_HELP)
    up.add_argument("--providers", type=Path, metavar="FILE",
                    help="a TOML file of [providers.NAME] tables: start workers on demand"
                         " (local, slurm, simulated; docs/providers.md)")  # fmt: skip
    up.set_defaults(func=_up)

    join = sub.add_parser("join", help="run a worker for the control plane at URL",
                          epilog=examples(
                              "export GPULAYER_JOIN_TOKEN=gl_...   # what `gpulayer up` printed",
                              "gpulayer join https://cp.example.org:8765/"
                              " --fingerprint sha256:...",
                              "gpulayer join URL --token-file join.token --name gpu-box-7"
                              " --slots 8 --label zone=lab",
                          ))  # fmt: skip
    join.add_argument("join_url", metavar="URL", help="the control plane's URL")
    join.add_argument("--token-file", type=Path, metavar="FILE",
                      help="read the join token from FILE (else $GPULAYER_JOIN_TOKEN);"
                      " - reads its first line from standard input")  # fmt: skip
    join.add_argument("--token", help="the join token itself (other users see it in `ps`:"
                      " prefer GPULAYER_JOIN_TOKEN or --token-file)")  # fmt: skip
    join.add_argument("--fingerprint", default=os.environ.get("GPULAYER_FINGERPRINT"),
                      metavar="sha256:...", help="pin the server's TLS certificate")  # fmt: skip
    join.add_argument("--insecure", action="store_true",
                      help="send tokens over http:// to another machine (clear text)")  # fmt: skip
    join.add_argument("--name", help="worker name (default: the hostname)")
    join.add_argument("--slots", type=bounded(int, 1), default=4, help="tasks run at once")
    join.add_argument("--advertise-address", "--address", dest="address", metavar="HOST",
                      help="where other workers reach this one for distributed jobs"
                           " (default: the IP used to reach the control plane, or that of"
                           " --interface)")  # fmt: skip
    join.add_argument("--interface", metavar="IF",
                      help="the network interface peers reach: its address is advertised and"
                           " ranks get GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=IF (default: the"
                           " one that reaches the control plane)")  # fmt: skip
    join.add_argument("--rendezvous-ports", type=port_range, metavar="LO-HI",
                      help="ports a gang's rendezvous may use here when this worker hosts"
                           " node 0 (default: the control plane's, 29500-31499)")  # fmt: skip
    join.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                      help="the worker's folders and credential")  # fmt: skip
    join.add_argument("--label", type=key_value, action="append", default=[], metavar="K=V",
                      help="a label jobs may select (--selector K=V), repeatable")  # fmt: skip
    join.add_argument("--warm-runners", type=bounded(int, 0), default=1, metavar="N",
                      help="Python function runners started ahead of the first call")  # fmt: skip
    join.add_argument("--runner-max-calls", type=bounded(int, 1), default=1000, metavar="N",
                      help="calls before a function runner is replaced by a fresh one")  # fmt: skip
    join.add_argument("--register-timeout", type=bounded(float, 0), default=60.0, metavar="S",
                      help="give up when the first registration gets no answer in S seconds"
                           " (0: keep trying; later outages are always waited out)")  # fmt: skip
    join.add_argument("--task-user", metavar="NAME", help=TASK_USER_HELP)
    join.add_argument("--env-cache", type=Path, metavar="DIR",
                      default=os.environ.get("GPULAYER_ENV_CACHE") or None,
                      help="where job environments are built and kept (default:"
                           " $GPULAYER_ENV_CACHE, else gpulayer-envs-<uid> in the temp"
                           " dir)")  # fmt: skip
    join.add_argument("--env-cache-size", type=_byte_size, metavar="SIZE",
                      default=os.environ.get("GPULAYER_ENV_CACHE_SIZE") or "20GiB",
                      help="most the env cache keeps, e.g. 20GiB; least recently used"
                           " environments no task uses go first (default 20GiB)")  # fmt: skip
    join.add_argument("--env-installer", choices=["uv", "pip"],
                      default=os.environ.get("GPULAYER_ENV_INSTALLER") or None,
                      help="what builds job environments (default: uv; pip when uv"
                           " is missing)")  # fmt: skip
    join.add_argument("--channel", choices=contracts.CHANNEL_MODES,
                      default=os.environ.get(contracts.CHANNEL_ENV, "").strip().lower() or "auto",
                      help="auto: take assignments over a live channel (WebSocket), HTTP long"
                           " polls when it cannot be opened; http: long polls only"
                           f" (default: ${contracts.CHANNEL_ENV}, else auto)")  # fmt: skip
    join.set_defaults(func=_join)

    sub.add_parser("demo", help="a tour on a throw-away local cluster",
                   epilog=examples("gpulayer demo")).set_defaults(func=_demo)  # fmt: skip


def default_data_dir() -> Path:
    """The one default data dir (:func:`gpulayer.paths.data_dir`): ``$GPULAYER_DATA_DIR``,
    else ``<Jupyter data dir>/gpulayer``, the folder ``jupyter lab`` uses too."""
    return paths.data_dir()


def _up(args: argparse.Namespace) -> int:
    # only `up` and `demo` need subprocesses
    from gpulayer.cli.cluster import LocalCluster, preferred_port

    _check_timings(args.heartbeat_seconds, args.lease_seconds)
    server_args = _provider_args(args.providers)
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    if (running := pidfile.running(data_dir)) is not None:
        raise errors.GpulayerError(
            f"gpulayer up is already running for {data_dir} (pid {running.pid}, {running.url});"
            " `gpulayer down` stops it"
        )
    for note in paths.prepare_data_dir(data_dir):  # an older gpulayer's folder moves here
        output.note(note)
    port = args.port if args.port is not None else preferred_port(args.host)
    cluster = LocalCluster(data_dir, port=port, host=args.host, workers=args.local_workers,
                           simulated_gpus=args.simulated_gpus, slots=args.slots,
                           tls=True if args.tls or args.certfile else None,
                           certfile=args.certfile, keyfile=args.keyfile,
                           heartbeat_seconds=args.heartbeat_seconds,
                           lease_seconds=args.lease_seconds,
                           task_user=args.task_user, server_args=server_args)  # fmt: skip
    # SIGTERM stops us like Ctrl-C does, so `kill <pid>` also cleans up.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        output.note(f"starting the gpulayer control plane and {args.local_workers} local"
                    f" worker(s) in {data_dir} ...")  # fmt: skip
        if args.local_workers and (as_you := _tasks_run_as_you(args.task_user)):
            output.note(as_you)
        steps = ["control plane"] + (["workers"] if args.local_workers else [])
        cluster.start(ready=progress.steps(steps, "starting gpulayer"))
        try:
            pidfile.write(data_dir, cluster.url)  # for `gpulayer down` and `gpulayer status`
            _print_up(cluster, args, data_dir)
            while True:
                time.sleep(0.5)
                cluster.check()
        except KeyboardInterrupt:
            output.note("stopping gpulayer ...")
            return 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the shutdown finish
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            cluster.stop()
            pidfile.remove(data_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _check_timings(heartbeat: float | None, lease: float | None) -> None:
    """Refuse timings with which a worker cannot keep its lease."""
    beat = contracts.DEFAULT_HEARTBEAT_SECONDS if heartbeat is None else heartbeat
    hold = contracts.DEFAULT_LEASE_SECONDS if lease is None else lease
    if beat <= 0:
        raise errors.ValidationError("--heartbeat-seconds must be above 0", field="heartbeat")
    if hold <= 2 * beat:
        raise errors.ValidationError(
            f"--lease-seconds ({hold:g}) must be more than twice --heartbeat-seconds ({beat:g})",
            field="lease",
        )


def _provider_args(path: Path | None) -> list[str]:
    """``--GpulayerApp.providers_file`` for a checked providers file (none without one).

    Raises
    ------
    ConfigError
        One line naming the file, the table and the key.
    """
    if path is None:
        return []
    import tomllib

    try:
        with path.open("rb") as f:
            contracts.parse_providers(tomllib.load(f).get("providers", {}))
    except OSError as e:
        raise errors.ConfigError(f"--providers {path}: {e.strerror or e}") from e
    except (tomllib.TOMLDecodeError, contracts.ProviderConfigError) as e:
        raise errors.ConfigError(f"--providers {path}: {e}") from e
    return [f"--GpulayerApp.providers_file={path.expanduser().resolve()}"]


def _tasks_run_as_you(task_user: str | None) -> str | None:
    """The one line that says local tasks run as this user (None when they do not)."""
    if os.geteuid() == 0 and task_user != "":
        return None
    import getpass

    return (
        f"note: local tasks run as you ({getpass.getuser()}) and can read your files,"
        " this data dir and its admin token included; start `gpulayer up` as root to run"
        " them as the unprivileged user gpulayer-task (docs/security.md)"
    )


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
    # Not on the join command line: other users of that machine could read it in `ps`.
    print(f"control plane:   {url}")
    if cluster.fingerprint:
        print(f"TLS certificate: {cluster.fingerprint}")
    print(f"admin token:     {token_file}")
    print(f"local workers:   {', '.join(cluster.workers) or 'none'}")
    print(f"connection:      {'saved to ' + str(saved) if saved else 'not saved'}")
    print("join from another machine:")
    print(f"  export GPULAYER_JOIN_TOKEN={cluster.join_token}")
    print(f"  gpulayer join {remote_url}{pin}")
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
    output.note("press Ctrl-C to stop")


def join_token(args: argparse.Namespace, from_env: str | None = None) -> str:
    """The join token of ``gpulayer join``: ``--token-file``, else ``--token`` (with a
    warning), else ``$GPULAYER_JOIN_TOKEN``, which is dropped from this process's
    environment either way, so nothing the worker starts inherits it (``from_env``:
    its value, when the caller dropped it already).

    Raises
    ------
    ConfigError
        When there is none, or the file cannot be read.
    """
    from_env = os.environ.pop("GPULAYER_JOIN_TOKEN", None) or from_env
    if args.token_file is not None:
        try:
            if str(args.token_file) == "-":  # `gpulayer up` hands it over once it exists
                token = _stdin_line().strip()
            else:
                token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise errors.ConfigError(
                f"cannot read the join token from {args.token_file}: {e.strerror or e}"
            ) from e
        if not token:
            raise errors.ConfigError(f"{args.token_file} is empty; it should hold the join token")
        return str(token)
    if args.token:
        output.note(
            "gpulayer: warning: --token is visible to other users of this machine (`ps`);"
            " use GPULAYER_JOIN_TOKEN or --token-file FILE"
        )
        return str(args.token)
    if from_env:
        return from_env
    raise errors.ConfigError(
        "no join token: set GPULAYER_JOIN_TOKEN or pass --token-file FILE"
        " (the join.token in the control plane's data dir, or what `gpulayer up` printed)"
    )


def _stdin_line() -> str:
    """A line of standard input, read from its descriptor when it has one, past
    ``sys.stdin``'s buffer: the worker reads it in a daemon thread, and a buffer's
    lock held by a thread still reading would stop the interpreter's exit."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # replaced (a test's StringIO)
        return sys.stdin.readline()
    data = b""
    while not data.endswith(b"\n") and (chunk := os.read(fd, 4096)):
        data += chunk
    return data.decode(errors="replace")


def port_range(text: str) -> tuple[int, int]:
    """``--rendezvous-ports LO-HI``."""
    from gpulayer.worker.network import parse_ports

    try:
        return parse_ports(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _join(args: argparse.Namespace) -> int:
    try:
        from gpulayer.worker import AgentConfig
        from gpulayer.worker import main as agent_main
    except ImportError as e:
        raise errors.GpulayerError(f"the gpulayer worker agent cannot be loaded: {e}") from e
    # `gpulayer up` starts its workers while the control plane starts, and hands them
    # the join token on stdin once it exists (--token-file -): the worker reads it
    # while its agent prepares, its runners starting (worker.agent.run_agent).
    from_env = os.environ.pop("GPULAYER_JOIN_TOKEN", None)  # before the worker starts anything
    later = args.token_file is not None and str(args.token_file) == "-"
    token = "" if later else join_token(args, from_env)
    cfg = AgentConfig(
        url=args.join_url, token=token, name=args.name, slots=args.slots,
        data_dir=args.data_dir, labels=dict(args.label), fingerprint=args.fingerprint,
        warm_runners=args.warm_runners, runner_max_calls=args.runner_max_calls,
        address=args.address, interface=args.interface, rendezvous_ports=args.rendezvous_ports,
        insecure=args.insecure, task_user=args.task_user,
        first_registration_seconds=args.register_timeout, env_cache=args.env_cache,
        env_cache_bytes=_byte_size(args.env_cache_size), env_installer=args.env_installer,
        channel=args.channel,
    )  # fmt: skip
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    # httpx logs every request at INFO: one line per heartbeat and poll is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return int(agent_main(cfg, (lambda: join_token(args, from_env)) if later else None))
    except ValueError as e:  # e.g. a malformed GPULAYER_SIMULATED_GPUS
        raise errors.ValidationError(str(e)) from e


def _byte_size(text: str | int) -> int:
    """An argparse type: a size such as ``20GiB`` or ``500MB``, in bytes."""
    import pydantic

    try:
        return int(pydantic.TypeAdapter(pydantic.ByteSize).validate_python(text))
    except pydantic.ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 20GiB") from None


def _demo(args: argparse.Namespace) -> int:
    from gpulayer.cli import demo

    return demo.main()
