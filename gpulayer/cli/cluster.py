"""A local gpulayer cluster: the control plane and workers as subprocesses.

:class:`LocalCluster` is what ``gpulayer up`` and ``gpulayer demo`` run, and what
notebooks CI and benchmarks start: the headless control plane (``python -m
jupyter_ext``: the extension's routes in a plain tornado server, ADR 0157) plus
``gpulayer join`` workers, all on this machine,
with their output in ``<data_dir>/logs/``.

With ``tls`` (the default when it listens beyond loopback) the control plane
serves HTTPS with a self-signed certificate kept in ``<data_dir>/tls/``; every
client the cluster makes, and every worker it starts, pins that certificate's
fingerprint. Secrets travel to the subprocesses in their environment, never on
their command lines (which other users of the machine can read).

It owns its processes and nothing else: no atexit hooks, no signal handlers.
:meth:`LocalCluster.stop` (or leaving the ``with`` block) terminates every
process it started, by PID, workers first. If the process that holds the cluster
dies without stopping it (``kill -9`` of ``gpulayer up``), its subprocesses die
with it (a parent-death signal, Linux), and each worker's tasks with the worker.
"""

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx
import psutil

from gpulayer import contracts, paths, tls
from gpulayer.cli import forks
from gpulayer.cli.processes import (
    DEFAULT_PORT,
    STOP_GRACE_SECONDS,
    Process,
    exited,
    free_port,
    is_loopback,
    log_tail,
    preferred_port,
    reap,
    signal_if_running,
    spawn,
)
from gpulayer.client import Connection
from gpulayer.errors import GpulayerError, NotFound
from gpulayer.private import private_dir
from gpulayer.worker import credential

log = logging.getLogger(__name__)

START_DEADLINE_SECONDS = 60.0
#: How often start-up looks whether the control plane answers (a refused connect
#: costs nothing) and whether the workers are ready (one small request each time):
#: on an idle machine the whole start takes about a second, so half a poll of
#: 50 ms each was a tenth of it (benchmarks/results/startup.md).
_HEALTH_POLL_SECONDS = 0.01
_POLL_SECONDS = 0.02

__all__ = [
    "DEFAULT_PORT",
    "START_DEADLINE_SECONDS",
    "STOP_GRACE_SECONDS",
    "LocalCluster",
    "free_port",
    "is_loopback",
    "log_tail",
    "preferred_port",
]


class LocalCluster:
    """A control plane and ``workers`` local workers, as subprocesses.

    Parameters
    ----------
    data_dir
        Holds the database, artifacts, tokens, worker folders and ``logs/``.
    port, host
        Where the control plane listens; a free port is picked when ``port`` is None.
    workers
        How many local workers :meth:`start` launches (named ``local-1``, ...).
    simulated_gpus
        ``GPULAYER_SIMULATED_GPUS`` for the local workers, e.g. ``"2xA100-80GB"``.
    slots
        Tasks each local worker runs at once.
    heartbeat_seconds, lease_seconds
        Passed to the control plane (``--GpulayerApp.*``) when given.
    base_url
        The Jupyter ``base_url``, e.g. ``"/a%40b/"``.
    env
        Extra environment variables for every subprocess.
    tls
        Serve HTTPS; None (default) means on exactly when ``host`` is not loopback.
    certfile, keyfile
        Serve this certificate (e.g. CA-signed) instead of a self-signed one; clients
        then verify it against their CA bundle rather than pinning it.
    server_args
        Extra ``--Class.trait=value`` arguments for the control plane.
    server_module
        What ``python -m`` runs as the control plane: ``jupyter_ext`` (headless, the
        default), ``jupyterlab`` (JupyterLab with the control plane and the sidebar
        inside, as the browser tests run it) or ``jupyter_server`` (a Jupyter server
        with the control plane inside, and Jupyter's kernels).
    task_user
        ``--task-user`` of the local workers: None for their default (``gpulayer-task``
        when root), ``""`` to run tasks as this user.

    Examples
    --------
    >>> with LocalCluster(tmp_path, simulated_gpus="1xA100-80GB") as cluster:
    ...     conn = cluster.connection()
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        workers: int = 1,
        simulated_gpus: str | None = None,
        slots: int = 4,
        heartbeat_seconds: float | None = None,
        lease_seconds: float | None = None,
        base_url: str = "/",
        env: Mapping[str, str] | None = None,
        tls: bool | None = None,
        certfile: str | os.PathLike[str] | None = None,
        keyfile: str | os.PathLike[str] | None = None,
        server_args: Sequence[str] = (),
        server_module: str = "jupyter_ext",
        task_user: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.tls = (not is_loopback(host) or certfile is not None) if tls is None else tls
        if certfile is not None and not self.tls:
            raise GpulayerError("a certfile needs tls=True")
        self.certfile = None if certfile is None else Path(certfile)
        self.keyfile = None if keyfile is None else Path(keyfile)
        self.server_args = list(server_args)
        self.server_module = server_module
        self.task_user = task_user
        self._fingerprint: str | None = None
        self.host = host
        self.port = port
        self.n_workers = workers
        self.simulated_gpus = simulated_gpus
        self.slots = slots
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_seconds = lease_seconds
        self.base_url = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"
        self.env = dict(env or {})
        self.jupyter_token = secrets.token_hex(24)
        self._server: subprocess.Popen[bytes] | None = None
        self._workers: dict[str, Process] = {}
        #: Forks the workers started with the control plane from one import (ADR 0151).
        self._forks: forks.ForkServer | None = None
        #: When each worker was started (wall clock, as the control plane stamps
        #: registrations): a row from before says nothing about this process.
        self._spawned_at: dict[str, float] = {}
        self._admin_token: str | None = None
        self._join_token: str | None = None
        self._worker_count = 0

    def __repr__(self) -> str:
        return f"<LocalCluster {self.url if self.port else 'not started'} workers={self.workers}>"

    # ----------------------------------------------------------- properties

    @property
    def _reach_host(self) -> str:
        """The address this machine reaches the control plane at."""
        return "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host

    @property
    def url(self) -> str:
        """The control plane URL (base_url included, ends with ``/``)."""
        if self.port is None:
            raise GpulayerError("the local cluster has not been started")
        host = self._reach_host
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}{self.base_url}"

    @property
    def fingerprint(self) -> str | None:
        """The pinned ``sha256:...`` of the self-signed certificate (None without TLS,
        or with a certificate of the caller's, which clients verify against a CA)."""
        return self._fingerprint

    @property
    def admin_token(self) -> str:
        """The first admin token, read from ``<data_dir>/admin.token``."""
        if self._admin_token is None:
            raise GpulayerError("the local cluster has not been started")
        return self._admin_token

    @property
    def join_token(self) -> str:
        """The reusable join token, read from ``<data_dir>/join.token``."""
        if self._join_token is None:
            raise GpulayerError("the local cluster has not been started")
        return self._join_token

    @property
    def workers(self) -> list[str]:
        """Names of the local workers this cluster started and has not stopped."""
        return list(self._workers)

    @property
    def server_pid(self) -> int | None:
        """The control plane's process id (None while it is not running)."""
        return None if self._server is None else self._server.pid

    def worker_pid(self, name: str) -> int | None:
        """The process id of the local worker ``name`` (None when it is not running)."""
        proc = self._workers.get(name)
        return None if proc is None or proc.poll() is not None else proc.pid

    @property
    def log_dir(self) -> Path:
        """Where the subprocesses' output goes."""
        return self.data_dir / "logs"

    def log_path(self, worker: str | None = None) -> Path:
        """The log file of the control plane, or of the worker named ``worker``."""
        name = "control-plane" if worker is None else f"worker-{worker}"
        return self.log_dir / f"{name}.log"

    def connection(self) -> Connection:
        """A new :class:`~gpulayer.client.Connection` with the admin token (caller closes)."""
        return Connection(self.url, self.admin_token, fingerprint=self._fingerprint)

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, ready: Callable[[str], None] | None = None) -> Self:
        """Start the control plane and the local workers; returns once all are ready.

        Parameters
        ----------
        ready
            Called with ``"control plane"``, then ``"workers"``, as each is ready
            (``gpulayer up`` draws its start-up progress with it).

        Raises
        ------
        GpulayerError
            If a process exits early or is not ready within 60 s; the message
            carries the tail of its log. Everything started so far is stopped.
        """
        private_dir(self.data_dir)  # tokens, db, logs: only this user may read them
        private_dir(self.log_dir)
        if self.port is None:
            self.port = free_port(self.host or "127.0.0.1")
        if self.tls and self.certfile is None:
            self.certfile, self.keyfile = tls.ensure_certificate(
                self.data_dir / "tls", tls.default_hosts(self.host)
            )
            self._fingerprint = tls.fingerprint_of_file(self.certfile)
        try:
            # The workers start while the control plane does (their imports and
            # start-up overlap it) and get the join token on stdin once it exists;
            # a worker whose old registration must be forgotten first starts after.
            fresh = not (self.data_dir / "gpulayer.db").exists() and not any(
                "db_path" in a for a in self.server_args
            )
            self._spawn_control_plane()
            if fresh and self.n_workers >= 2 and forks.available():
                # One import for all of them (ADR 0151); they share this env exactly.
                env = {**self.env, **self._gpus_env(None)}
                self._forks = forks.ForkServer(
                    self.log_dir / "forkserver.log", env, cwd=self.data_dir
                )
            early = [self._add_worker(early=True) for _ in range(self.n_workers if fresh else 0)]
            self._await_control_plane()
            for name in early:
                self._hand_join_token(name)
            if ready is not None:
                ready("control plane")
            names = early + [self._add_worker() for _ in range(self.n_workers - len(early))]
            self.wait_for_workers(names)
            if ready is not None and names:
                ready("workers")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate the workers, then the control plane (SIGTERM, then SIGKILL)."""
        procs = list(self._workers.values())
        self._workers.clear()
        for proc in procs:
            signal_if_running(proc, signal.SIGTERM)
        for proc in procs:
            reap(proc)
        if self._server is not None:
            server, self._server = self._server, None
            signal_if_running(server, signal.SIGTERM)
            reap(server)
        if self._forks is not None:  # it exits once its workers have
            fork_server, self._forks = self._forks, None
            fork_server.close()
            reap(fork_server.proc)

    def restart_control_plane(self, sig: int = signal.SIGTERM) -> None:
        """Stop only the control plane (with ``sig``: SIGKILL for a crash) and start it
        again (same port, same data dir)."""
        if self._server is not None:
            server, self._server = self._server, None
            signal_if_running(server, sig)
            reap(server)
        self._start_control_plane()

    def check(self) -> None:
        """Raise if the control plane has exited.

        Raises
        ------
        GpulayerError
            With the tail of the control plane log.
        """
        if self._server is None or self._server.poll() is not None:
            code = None if self._server is None else self._server.returncode
            raise GpulayerError(exited("the control plane", code, self.log_path()))

    # -------------------------------------------------------------- workers

    def add_worker(
        self,
        name: str | None = None,
        *,
        slots: int | None = None,
        simulated_gpus: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
    ) -> Process:
        """Start one more local worker (``gpulayer join``) and return its process.

        Parameters
        ----------
        name
            Defaults to ``local-<n>``.
        slots, simulated_gpus
            Override the cluster's values for this worker.
        labels, env
            Worker labels and extra environment variables.
        wait
            Return only once the worker is ``ready``.
        """
        name = self._add_worker(name, slots, simulated_gpus, labels, env)
        if wait:
            self.wait_for_workers([name])
        return self._workers[name]

    def stop_worker(self, name: str, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` to the local worker ``name`` and reap it; returns its exit code."""
        proc = self._workers.pop(name)
        signal_if_running(proc, sig)
        reap(proc)
        return proc.returncode

    def wait_for_workers(
        self, names: list[str], timeout: float = START_DEADLINE_SECONDS
    ) -> list[contracts.Worker]:
        """Block until every worker in ``names`` is ``ready`` in ``GET workers``.

        Raises
        ------
        GpulayerError
            If one exits or the deadline passes; the message has its log tail.
        """
        deadline = time.monotonic() + timeout
        with self.connection() as conn:
            while True:
                for name in names:
                    proc = self._workers.get(name)
                    if proc is not None and proc.poll() is not None:
                        raise GpulayerError(
                            exited(f"worker {name}", proc.returncode, self.log_path(name))
                        )
                ready = {w.name: w for w in conn.workers() if self._ready_now(w)}
                if all(n in ready for n in names):
                    return [ready[n] for n in names]
                if time.monotonic() > deadline:
                    late = [n for n in names if n not in ready]
                    raise GpulayerError(
                        f"worker {late[0]} was not ready after {timeout:g}s; its log ends:\n"
                        + log_tail(self.log_path(late[0]))
                    )
                time.sleep(_POLL_SECONDS)

    def _ready_now(self, worker: contracts.Worker) -> bool:
        """``ready``, and registered or heard since this cluster started it (a row
        left from before a restart is not the new process)."""
        since = self._spawned_at.get(worker.name)
        heard = worker.last_heartbeat or worker.registered_at
        return worker.state == "ready" and (since is None or heard.timestamp() >= since)

    # ------------------------------------------------------------ internals

    def _add_worker(
        self,
        name: str | None = None,
        slots: int | None = None,
        simulated_gpus: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        early: bool = False,
    ) -> str:
        """Start a worker; ``early``: before the control plane is up (a new data dir,
        so no old registration to forget), its join token to follow on stdin
        (:meth:`_hand_join_token`)."""
        if name is None:
            self._worker_count += 1
            name = f"local-{self._worker_count}"
        if name in self._workers:
            raise GpulayerError(f"a local worker named {name!r} is already running")
        folder = self.data_dir / "workers" / name
        if not early and credential.CredentialFile(folder).load(self.url) is None:
            self._forget_stale(name)
        argv = [sys.executable, "-m", "gpulayer", "join", self.url,
                "--name", name, "--slots", str(slots or self.slots),
                "--data-dir", str(folder)]  # fmt: skip
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        if self.task_user is not None:
            argv += ["--task-user", self.task_user]
        extra = dict(env or {})
        if early:
            argv += ["--token-file", "-"]
        else:
            extra["GPULAYER_JOIN_TOKEN"] = self.join_token
        if self._fingerprint is not None:
            argv += ["--fingerprint", self._fingerprint]
        extra.update(self._gpus_env(simulated_gpus))
        self._spawned_at[name] = time.time()
        forked = None
        if early and self._forks is not None and not env:
            try:
                forked = self._forks.fork(
                    argv[3:], log_file=self.log_path(name), cwd=self.data_dir, stdin_pipe=True
                )
            except OSError as e:  # it is gone: this worker starts an interpreter of its own
                log.warning("%s; starting worker %s on its own", e, name)
        if forked is not None:
            self._workers[name] = forked
        else:
            self._workers[name] = spawn(
                argv, self.log_path(name), {**self.env, **extra}, cwd=self.data_dir,
                stdin_pipe=early,
            )  # fmt: skip
        return name

    def _gpus_env(self, simulated_gpus: str | None) -> dict[str, str]:
        gpus = simulated_gpus if simulated_gpus is not None else self.simulated_gpus
        return {} if gpus is None else {"GPULAYER_SIMULATED_GPUS": gpus}

    def _hand_join_token(self, name: str) -> None:
        """Give a worker started early its join token (its ``--token-file -``)."""
        stdin = self._workers[name].stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it exited: wait_for_workers says why
            stdin.write(self.join_token.encode() + b"\n")
            stdin.close()

    def _forget_stale(self, name: str) -> None:
        """Forget a registration of ``name`` that its local worker cannot reclaim: its
        folder holds no credential for this URL (it is new, was lost, predates worker
        credentials, or was issued while the control plane listened on another port:
        a credential goes back only to the URL that issued it), and a join token
        registers only free names (ADR 0070)."""
        with self.connection() as conn, contextlib.suppress(NotFound):
            conn.forget_worker(name)
            log.info("forgot an earlier registration of local worker %s", name)

    def _control_plane_argv(self) -> list[str]:
        argv = [
            sys.executable, "-m", self.server_module,
            f"--ServerApp.ip={self.host}",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.open_browser=False",
            "--ServerApp.allow_root=True",
            f"--ServerApp.base_url={self.base_url}",
            f"--ServerApp.root_dir={self.data_dir}",
            f"--GpulayerApp.data_dir={self.data_dir}",
        ]  # fmt: skip
        if self.tls:
            argv += [f"--ServerApp.certfile={self.certfile}", f"--ServerApp.keyfile={self.keyfile}"]
        if self.heartbeat_seconds is not None:
            argv.append(f"--GpulayerApp.heartbeat_seconds={self.heartbeat_seconds}")
        if self.lease_seconds is not None:
            argv.append(f"--GpulayerApp.lease_seconds={self.lease_seconds}")
        return argv + self.server_args

    def _start_control_plane(self) -> None:
        self._spawn_control_plane()
        self._await_control_plane()

    def _spawn_control_plane(self) -> None:
        # Jupyter's own token in the environment (JUPYTER_TOKEN), not on the command line.
        env = {"JUPYTER_TOKEN": self.jupyter_token}
        self._server = spawn(
            self._control_plane_argv(), self.log_path(), {**self.env, **env}, cwd=self.data_dir
        )

    def _await_control_plane(self) -> None:
        """Wait until the control plane answers, then read its tokens."""
        self._wait_healthy()
        # The control plane writes both tokens before health answers.
        try:
            self._admin_token = (self.data_dir / "admin.token").read_text().strip()
            self._join_token = (self.data_dir / "join.token").read_text().strip()
        except OSError as e:
            raise GpulayerError(
                f"the control plane is up but its tokens are unreadable: {e}"
            ) from e

    def _listening(self, pid: int) -> bool:
        """Whether process ``pid`` (this cluster's control plane) listens on the port."""
        try:
            proc = psutil.Process(pid)
            sockets = proc.net_connections("inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return any(s.status == psutil.CONN_LISTEN and s.laddr.port == self.port for s in sockets)

    def _announced(self) -> bool:
        """Whether this cluster's control plane wrote that it listens on the port."""
        assert self._server is not None
        return paths.lock_holder(self.data_dir) == (self._server.pid, self.port)

    def _accepts(self) -> bool:
        """Whether anything accepts connections on the control plane's port."""
        try:
            with socket.create_connection((self._reach_host, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def _wait_healthy(self) -> None:
        assert self._server is not None
        url = self.url + contracts.API_PREFIX.lstrip("/") + "/health"
        deadline = time.monotonic() + START_DEADLINE_SECONDS
        verify = tls.for_httpx(tls.verify_for(self.url, self._fingerprint), self.url)
        ours = False
        with httpx.Client(timeout=httpx.Timeout(2.0), verify=verify) as http:
            while True:
                if self._server.poll() is not None:
                    raise GpulayerError(
                        exited("the control plane", self._server.returncode, self.log_path())
                    )
                # Another server on this port (ours then fails to bind it, and exits
                # with its reason in the log) is not our control plane. Ours notes its
                # port in the data dir's lock file once bound, before it is ready;
                # failing that, the kernel's socket table says (~10-25 ms to read).
                pid = self._server.pid
                ours = ours or (self._accepts() and (self._announced() or self._listening(pid)))
                try:
                    if ours and http.get(url).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not answering yet
                if time.monotonic() > deadline:
                    raise GpulayerError(
                        f"the control plane did not answer {url} within "
                        f"{START_DEADLINE_SECONDS:g}s; its log ends:\n{log_tail(self.log_path())}"
                    )
                time.sleep(_HEALTH_POLL_SECONDS)
