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

from gpulayer import errors
from gpulayer.cli import output
from gpulayer.client import config
from gpulayer.client.specs import key_value

if TYPE_CHECKING:
    from gpulayer.cli.cluster import LocalCluster


TASK_USER_HELP = (
    "who runs tasks when the worker is root (default: gpulayer-task, created when missing;"
    " '' runs them as the worker's own user, which can read its data dir)"
)


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add ``up``, ``join`` and ``demo`` to the ``gpulayer`` parser."""
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
    up.add_argument("--task-user", metavar="NAME", help=TASK_USER_HELP)
    up.set_defaults(func=_up)

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
    join.add_argument("--label", type=key_value, action="append", default=[], metavar="K=V")
    join.add_argument("--warm-runners", type=int, default=1, metavar="N",
                      help="Python function runners started ahead of the first call")  # fmt: skip
    join.add_argument("--runner-max-calls", type=int, default=1000, metavar="N",
                      help="calls before a function runner is replaced by a fresh one")  # fmt: skip
    join.add_argument("--task-user", metavar="NAME", help=TASK_USER_HELP)
    join.set_defaults(func=_join)

    sub.add_parser("demo", help="a tour on a throw-away local cluster").set_defaults(func=_demo)


def default_data_dir() -> Path:
    """``$GPULAYER_DATA_DIR``, else ``$XDG_DATA_HOME/gpulayer`` (``~/.local/share/gpulayer``)."""
    if os.environ.get("GPULAYER_DATA_DIR"):
        return Path(os.environ["GPULAYER_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "gpulayer"


def _up(args: argparse.Namespace) -> int:
    # only `up` and `demo` need subprocesses
    from gpulayer.cli.cluster import LocalCluster, preferred_port

    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    port = args.port if args.port is not None else preferred_port(args.host)
    cluster = LocalCluster(data_dir, port=port, host=args.host, workers=args.local_workers,
                           simulated_gpus=args.simulated_gpus, slots=args.slots,
                           tls=True if args.tls or args.certfile else None,
                           certfile=args.certfile, keyfile=args.keyfile,
                           task_user=args.task_user)  # fmt: skip
    # SIGTERM stops us like Ctrl-C does, so `kill <pid>` also cleans up.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        output.note(f"starting the gpulayer control plane and {args.local_workers} local"
                    f" worker(s) in {data_dir} ...")  # fmt: skip
        if args.local_workers and (as_you := _tasks_run_as_you(args.task_user)):
            output.note(as_you)
        cluster.start()
        try:
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
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
    output.note("press Ctrl-C to stop")


def _join(args: argparse.Namespace) -> int:
    try:
        from gpulayer.worker import AgentConfig
        from gpulayer.worker import main as agent_main
    except ImportError as e:
        raise errors.GpulayerError(f"the gpulayer worker agent cannot be loaded: {e}") from e
    cfg = AgentConfig(
        url=args.join_url, token=args.token, name=args.name, slots=args.slots,
        data_dir=args.data_dir, labels=dict(args.label), fingerprint=args.fingerprint,
        warm_runners=args.warm_runners, runner_max_calls=args.runner_max_calls,
        address=args.address, task_user=args.task_user,
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


def _demo(args: argparse.Namespace) -> int:
    from gpulayer.cli import demo

    return demo.main()
