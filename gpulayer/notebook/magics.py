"""IPython magics: ``%%gpulayer`` runs a cell on a worker, ``%gpulayer`` manages.

Load them with ``%load_ext gpulayer``. In a kernel started by a Jupyter server
that hosts the gpulayer extension this also connects to that server, with no
URL or token; elsewhere the connection comes from ``GPULAYER_URL`` /
``GPULAYER_TOKEN``, then the file ``gpulayer up`` saved, then
``%gpulayer connect URL --token T``.

The cell magic::

    %%gpulayer [--gpus N] [--gpu-memory 24GiB] [--worker NAME] [--session NAME]
               [--idle-timeout 30m] [--timeout 10m] [--queue-timeout 10m] [--push a,b]
               [--pull c,d] [--no-wait] [--api-access] [--secret NAME ...]

runs the cell in a headless kernel on a worker: a fresh one, or with
``--session NAME`` the session's persistent kernel (started on first use with
the given ``--gpus``/``--gpu-memory``/``--worker``), so variables survive from
cell to cell. What it prints streams into the cell while it runs; rich output
(images, HTML, figures, tables) renders as if local; a remote exception shows
the remote traceback marked with worker and job; the notebook's interrupt
button interrupts the remote cell (twice: cancels it). ``--push`` sends local
variables first and ``--pull`` brings variables back after it (cloudpickle:
same Python minor version on both sides). ``--no-wait`` returns the
:class:`~gpulayer.Job` at once. While the cell waits for a worker it says why
(within about two seconds, at once when no worker could ever run it, and again
when the reason changes); ``--queue-timeout`` ends it ``timed_out`` if no worker
started it in time. ``--api-access`` lets the remote kernel call
gpulayer itself (``gl.connect()`` there connects as you, role ``submitter`` at
most, while it runs); with ``--session`` it applies when the cell starts the session.
``--secret NAME`` (repeatable) gives the remote kernel your secret ``NAME`` as an
environment variable (``gpulayer secret set NAME`` stores it; printed, it shows as
``***``); with ``--session`` the session's kernel gets it when this cell starts the
session, and naming a secret a running session lacks is an error.

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
    %gpulayer connect URL [--token T] [--fingerprint sha256:...] [--insecure]

Bad options raise :class:`~IPython.core.error.UsageError` with what to fix.
"""

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from gpulayer import contracts, errors
from gpulayer.client import Job, cells, config, connect, default_connection, specs
from gpulayer.notebook import commands
from gpulayer.notebook.commands import connection
from gpulayer.notebook.render import Renderer, follow

#: The resource options ``%%gpulayer`` takes (a cell's, or a new session's).
CELL_RESOURCES = ("gpus", "gpu_memory", "worker")

_IDENT = "a Python variable name"


def _duration(text: str) -> float:
    try:
        return contracts.parse_duration(text)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _option(name: str, **override: Any) -> Any:
    """The ``@argument`` of option ``name``, derived from :mod:`gpulayer.client.specs`."""
    flag, kwargs = specs.argument(name, **override)
    return argument(flag, **kwargs)


def _names(text: str | None, option: str) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not n.isidentifier():
            raise UsageError(f"{option}: {n!r} is not {_IDENT}; give names like a,b")
    return names


def _env_flags(fn: Any) -> Any:
    """The ``@argument`` of every env flag (:data:`gpulayer.client.specs.ENV_FLAGS`)."""
    for flag, kwargs in reversed(specs.ENV_FLAGS.items()):
        fn = argument(flag, **kwargs)(fn)
    return fn


@magics_class
class GpulayerMagics(Magics):
    """``%%gpulayer`` and ``%gpulayer``; see the module docstring."""

    @magic_arguments()
    @_option("gpus", help="whole GPUs (with --session: the session's)")
    @_option("gpu_memory", help="memory of each GPU, e.g. 24GiB")
    @_option("worker", help="run on this worker only")
    @argument("--session", metavar="NAME", help="run in this persistent remote kernel")
    @argument("--idle-timeout", metavar="DURATION", help="a new session ends after this idle")
    @argument("--timeout", metavar="DURATION", help="the cell's time limit, e.g. 10m")
    @argument("--queue-timeout", metavar="DURATION",
              help="longest wait for a worker, e.g. 10m; then the cell ends timed_out")  # fmt: skip
    @argument("--push", metavar="a,b", help="variables to send to the remote kernel first")
    @argument("--pull", metavar="c,d", help="variables to bring back afterwards")
    @argument("--no-wait", action="store_true", help="return the Job at once")
    @_option("api_access", help="the remote kernel may call gpulayer (with --session: the"
             " session's kernel, when this cell starts it)")  # fmt: skip
    @_option("secrets", help="a secret of yours the kernel gets as env variable NAME"
             " (repeatable; with --session: when this cell starts it)")  # fmt: skip
    @_option("nodes", default=None, help="distributed: run the cell on N workers at once")
    @_option("nproc_per_node", default=None, metavar="M")
    @_option("launcher", default=None, help="distributed: how ranks start")
    @_env_flags
    @cell_magic
    def gpulayer(self, line: str, cell: str) -> Any:
        """Run the cell in a remote kernel (see ``gpulayer.notebook.magics``)."""
        args = parse_argstring(self.gpulayer, line)
        return self._run_cell(args, cell)

    def _user_ns(self) -> dict[str, Any]:
        shell = self.shell
        if shell is None:  # registered magics always have one
            raise UsageError("the gpulayer magics need an IPython shell")
        ns: dict[str, Any] = shell.user_ns
        return ns

    def _run_cell(self, args: Any, source: str) -> Any:
        if args.gpus < 0:
            raise UsageError("--gpus must be 0 or more")
        timeout = _duration(args.timeout) if args.timeout else None
        queue_timeout = _duration(args.queue_timeout) if args.queue_timeout else None
        if args.idle_timeout:
            _duration(args.idle_timeout)
        if args.idle_timeout and not args.session:
            raise UsageError("--idle-timeout applies to a --session")
        push = _names(args.push, "--push")
        pull = _names(args.pull, "--pull")
        if pull and args.no_wait:
            raise UsageError("--pull needs the cell to finish here; drop --no-wait")
        ns = self._user_ns()
        missing = [n for n in push if n not in ns]
        if missing:
            raise UsageError(f"--push: {missing[0]!r} is not defined in this notebook")
        resources = {k: v for k, v in specs.given(args, CELL_RESOURCES).items() if v}
        resources["gpus"] = args.gpus
        if args.nodes is not None or args.nproc_per_node is not None or args.launcher:
            if args.session:
                raise UsageError("--nodes runs the cell as a script on every rank; drop --session")
            values = {n: ns[n] for n in push}
            resources["queue_timeout"] = queue_timeout
            return self._run_gang(args, source, values, pull, timeout, resources)
        conn = connection()
        try:
            env = specs.env_options(args, conn).get("environment")
            if args.session:
                # The env applies when this cell starts the session; its kernel keeps it.
                cells.ensure_session(
                    conn, args.session, idle_timeout=args.idle_timeout,
                    api_access=args.api_access, secrets=args.secrets, environment=env, **resources,
                )  # fmt: skip
                resources, env = {}, None
            run = cells.submit(
                conn, source, session=args.session, push={n: ns[n] for n in push},
                pull=pull, timeout=timeout, queue_timeout=queue_timeout,
                api_access=args.api_access, secrets=args.secrets, environment=env, **resources,
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
                timeout=timeout, api_access=args.api_access, secrets=args.secrets,
                connection=conn,
                **gang, **resources, **specs.env_options(args, conn),
            )  # fmt: skip
            if args.no_wait:
                return fn.spawn(source, values, pull).job
            pulled = fn.run(source, values, pull)  # raises the failing rank's exception
        except errors.ValidationError as e:
            raise UsageError(e.message) from e
        self._user_ns().update(pulled)
        return None

    @magic_arguments()
    @argument("command", help="status, workers, jobs, sessions, logs, cancel, end, connect")
    @argument("target", nargs="?", help="job id (logs, cancel), session (end), URL (connect)")
    @argument("--token", help="with connect: a gpulayer token")
    @argument("--fingerprint", help="with connect: the server certificate's sha256")
    @argument("--insecure", action="store_true",
              help="with connect: send the token over http:// to another machine")  # fmt: skip
    @line_magic("gpulayer")  # type: ignore[arg-type]  # IPython types line_magic(name) as a union
    def gpulayer_line(self, line: str) -> Any:
        """Manage gpulayer from a notebook (see ``gpulayer.notebook.magics``)."""
        args = parse_argstring(self.gpulayer_line, line)
        return commands.run(args.command, args)


# ------------------------------------------------------------------ loading


def load(ipython: Any) -> None:
    """Register the magics and connect without ceremony where that is possible."""
    ipython.register_magics(GpulayerMagics)
    if default_connection() is not None:
        return
    parent = config.jupyter_parent()
    if parent is not None:
        try:
            # The parent server runs on this machine (its runtime file is here), so
            # its URL, by whatever name, does not leave it.
            connect(parent.url, parent.token, insecure=True)
            return
        except errors.GpulayerError:
            pass  # a Jupyter server without gpulayer: try the other ways
    try:
        connect()
    except errors.GpulayerError as e:
        print(f"gpulayer: not connected yet ({e.message}); use %gpulayer connect URL --token T",
              file=sys.stderr)  # fmt: skip
