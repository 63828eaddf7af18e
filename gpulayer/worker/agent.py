"""The headless worker agent behind ``gpulayer join URL``: its loops.

The agent only ever calls out (docs/api.md, "Worker protocol"): it registers with
the join token, then uses its own worker token to heartbeat, long-poll for
assignments, ship logs, upload artifacts and complete tasks. Two loops run side
by side, plus one pipeline per task::

    register ─┬─ heartbeat loop   every heartbeat_seconds; kill_tasks -> abandon
              ├─ acquire loop     the live channel (assignments pushed; docs/channel.md),
              │                   else POST acquire?wait=30 -> start assignments, cancel
              ├─ lease loop       no heartbeat answered for lease - 2 x heartbeat:
              │                   stop every task (reported lost), register again
              └─ task pipeline    prepare dir + bundle -> Run -> flush logs
                                  -> upload artifacts -> complete -> remove dir

Its task processes never outlive it: :mod:`~gpulayer.worker.spawning` starts them
so they die with the agent, and its supervisor kills them when the agent's lease
runs out while it is frozen (docs/adr/0082-fencing.md).

The pieces: :mod:`~gpulayer.worker.uplink` (HTTP, retry, re-registration),
:mod:`~gpulayer.worker.pipeline` (run and deliver one task),
:mod:`~gpulayer.worker.launch` (which :class:`~gpulayer.worker.runs.Run` a task gets).
"""

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pydantic
from websockets.asyncio.client import ClientConnection

import gpulayer
from gpulayer import contracts as c
from gpulayer import tls
from gpulayer.errors import ConfigError
from gpulayer.private import private_dir, tighten
from gpulayer.startup import release_gc
from gpulayer.worker import devices, network, spawning, task_user
from gpulayer.worker.channel import (
    ChannelRefused,
    ChannelUnavailable,
    WorkerChannel,
    open_kernel_relay,
)
from gpulayer.worker.credential import CredentialFile
from gpulayer.worker.environments import DEFAULT_MAX_BYTES, EnvCache, default_root
from gpulayer.worker.functions import RunnerPool
from gpulayer.worker.kernels import KernelHost
from gpulayer.worker.launch import Launcher
from gpulayer.worker.lease import Lease
from gpulayer.worker.pipeline import Pipeline
from gpulayer.worker.process import in_daemon_thread
from gpulayer.worker.spawning import Fence
from gpulayer.worker.telemetry import GpuTelemetry, TreeSampler
from gpulayer.worker.uplink import BACKOFF_CAP_SECONDS, BACKOFF_START_SECONDS, Uplink, describe
from gpulayer.worker.workspace import ControlPlaneAddress, inherited_env, make_tasks_root

log = logging.getLogger(__name__)

_ACQUIRE_WAIT_SECONDS = 30
#: After a refused upgrade (a proxy that blocks WebSockets), long polls for this long.
_CHANNEL_REFUSED_RETRY_SECONDS = 60.0
_SHUTDOWN_DELIVERY_SECONDS = 5.0


@dataclass
class AgentConfig:
    """How ``gpulayer join`` runs this worker."""

    url: str  # Jupyter server root URL incl. base_url, e.g. "http://127.0.0.1:8765/a%40b/"
    token: str  # join token (role join)
    name: str | None = None  # default: hostname
    slots: int = 4  # tasks at once
    data_dir: Path | None = None  # default: tempfile.gettempdir()/gpulayer-worker-<name>
    labels: dict[str, str] = field(default_factory=dict)
    kill_grace_seconds: float = 5.0  # SIGTERM -> SIGKILL grace
    log_batch_seconds: float = 0.05  # how long to gather log lines into one batch
    fingerprint: str | None = None  # pinned sha256 of the server's TLS certificate
    warm_runners: int = 1  # function runners started ahead of the first call
    runner_max_calls: int = 1000  # calls before a function runner is replaced
    address: str | None = None  # where other workers reach this one (gang rendezvous)
    interface: str | None = None  # the interface peers reach (default: the one of address)
    rendezvous_ports: tuple[int, int] | None = None  # MASTER_PORT range when it hosts node 0
    insecure: bool = False  # allow tokens over http:// to a host that is not this machine
    first_registration_seconds: float = 60.0  # give up on an unreachable URL (0: never)
    # Who runs tasks when the worker is root: None for gpulayer-task, "" for the worker's user.
    task_user: str | None = None
    env_cache: Path | None = None  # job environments (default: environments.default_root())
    env_cache_bytes: int = DEFAULT_MAX_BYTES  # their size cap (least recently used go first)
    env_installer: str | None = None  # "uv" or "pip" (default: uv when installed)
    # "auto": the live channel (WebSocket), long polls when it cannot be opened; "http": long polls.
    channel: str = "auto"


class Agent:
    """One running worker: registration, loops, tasks. Use :func:`run_agent`."""

    def __init__(
        self, config: AgentConfig, http: httpx.AsyncClient, fence: Fence | None = None
    ) -> None:
        self.config = config
        self._fence = fence
        self.name = config.name or socket.gethostname()
        self.data_dir = Path(
            config.data_dir or Path(tempfile.gettempdir(), f"gpulayer-worker-{self.name}")
        ).absolute()
        # Its credential, blob cache and environments: this user's only from now on;
        # what a loose umask left readable inside is tightened once it has registered.
        private_dir(self.data_dir)
        self.tasks_root = make_tasks_root(self.name)  # outside the data dir
        spawning.remove_when_gone(self.tasks_root)  # by the supervisor, after a kill -9
        self.devices = devices.discover()
        self.network = self._network()
        self._gpu_telemetry = GpuTelemetry(self.devices)
        self._trees = TreeSampler()
        self._lease = Lease(fence)
        self._acquired_seq: int | None = None  # the newest acquire answer dispatched
        self._register_again = False  # tasks were stopped for the lease: re-register
        self._uplink = Uplink(
            http,
            config.url,
            config.token,
            name=self.name,
            registration=self._registration,
            on_registered=self._registered,
            blob_dir=self.data_dir / "blobs",
            credentials=CredentialFile(self.data_dir),
        )
        self._runners = RunnerPool(
            inherited_env(),
            homes=self.tasks_root,
            max_idle=config.slots,
            max_calls=config.runner_max_calls,
            prestart=config.warm_runners,
        )
        self.envs = EnvCache(
            config.env_cache or default_root(),
            max_bytes=config.env_cache_bytes,
            # A root worker whose tasks run as another user builds as root: wheels only.
            wheels_only=os.geteuid() == 0 and spawning.task_user() is not None,
            installer=config.env_installer,
            base_env=inherited_env(),
        )
        self._runners.hold = self.envs.hold
        self._kernels = KernelHost()
        launcher = Launcher(
            worker_name=self.name,
            tasks_root=self.tasks_root,
            runners=self._runners,
            kernels=self._kernels,
            blob=self._uplink.blob,
            blob_file=self._uplink.blob_file,
            kill_grace_seconds=config.kill_grace_seconds,
            control_plane=ControlPlaneAddress(config.url, config.fingerprint, config.insecure),
            network=lambda: self.network,
            envs=self.envs,
            report_env=self._report_env,
            open_relay=self._open_relay,
        )
        self._pipeline = Pipeline(
            self._uplink,
            launcher,
            slots=config.slots,
            log_batch_seconds=config.log_batch_seconds,
            heartbeat=self._heartbeat,
            lease=self._lease,
        )
        self._tasks = self._pipeline.tasks
        self._registration()  # fail fast on a bad name, slots or labels
        if config.channel not in c.CHANNEL_MODES:
            modes = ", ".join(c.CHANNEL_MODES)
            raise ConfigError(f"--channel must be one of {modes}, not {config.channel!r}")
        self._channel: WorkerChannel | None = None
        if config.channel == "auto":
            verify = tls.verify_for(config.url, config.fingerprint)
            self._channel = WorkerChannel(config.url, verify)
            self._uplink.channel = self._channel
        self._channel_at = 0.0  # when to try the channel again (loop time)
        self._channel_failures = 0
        # An acquire path broke (a channel closed, a long poll failed): an answer may
        # have been lost on the way. The next one asks for a fresh seq at once, and a
        # heartbeat follows it (docs/adr/0150).
        self._resync_due = False
        self._beats: set[asyncio.Task[None]] = set()

    async def _open_relay(self, job_id: str) -> ClientConnection:
        """The worker's end of kernel ``job_id``'s relay (docs/kernels.md)."""
        uplink, config = self._uplink, self.config
        verify = tls.verify_for(config.url, config.fingerprint)
        return await open_kernel_relay(
            config.url, verify, uplink.worker_id, uplink.worker_token, job_id
        )

    # ------------------------------------------------------------ life cycle

    async def serve(self, join_token: Awaitable[str] | None = None) -> None:
        """Register, then heartbeat and acquire until cancelled; with ``join_token``,
        the prestarted runners start while it is awaited, and it is the token that
        registers (``gpulayer up`` hands it over once its control plane is up)."""
        psutil.cpu_percent(None)  # the first reading is meaningless; start the window
        user = spawning.task_user()
        proof = user is not None and self._runners.prestart > 0
        self._runners.start(quiet=proof)
        if user is not None and not proof:
            await asyncio.to_thread(task_user.check_reachable, user)
        if join_token is not None:
            self._uplink.join_token = await join_token
        if user is not None and proof:
            await self._prove_task_user(user)
        await self._first_registration()
        release_gc()  # held by `gpulayer join` through its start (ADR 0147)
        log.info("distributed jobs: %s", network.describe(self.network))
        if user is not None:
            log.info("tasks run as %s (uid %d) in %s", user.name, user.uid, self.tasks_root)
        await asyncio.gather(
            self._tighten(), self._heartbeat_loop(), self._acquire_loop(), self._lease_loop()
        )

    async def _tighten(self) -> None:
        """Take group and other bits off everything in the data dir (ADR 0156: the
        folder is its user's alone already; a walk of a large blob cache no longer
        delays the registration)."""
        try:
            fixed = await asyncio.to_thread(tighten, self.data_dir)
        except OSError as e:
            log.warning("could not tighten the files in %s: %s", self.data_dir, e)
            return
        if fixed:
            log.warning("%d files or folders in %s were readable by others; now only"
                        " their owner may read them", fixed, self.data_dir)  # fmt: skip

    async def shutdown(self) -> None:
        """Release every task (reported ``lost``, so it is retried), and wait for its processes."""
        self._gpu_telemetry.close()
        if self._tasks:
            log.info("worker %s stopping %d running task(s)", self.name, len(self._tasks))
            await self._pipeline.release(
                self.config.kill_grace_seconds + _SHUTDOWN_DELIVERY_SECONDS
            )
        await self._runners.close()
        await self._kernels.close()
        await asyncio.to_thread(shutil.rmtree, self.tasks_root, True)

    # ---------------------------------------------------------- registration

    async def _prove_task_user(self, user: task_user.TaskUser) -> None:
        """Wait for the prestarted runner: it runs as the task user, so its coming up
        proves that user can run this Python and gpulayer (no probe process of its
        own, ADR 0158). When it fails, the probe says why: the one-line
        ``ConfigError``, before the worker registers."""
        failed = await self._runners.prestarted()
        if failed is None:
            return
        await asyncio.to_thread(task_user.check_reachable, user)  # raises: why
        log.warning("the prestarted function runner could not start: %s", failed)

    async def _first_registration(self) -> None:
        """Register, giving up on a control plane that never answers within
        ``first_registration_seconds`` (a wrong URL); later outages are waited out."""
        limit = self.config.first_registration_seconds
        try:
            await asyncio.wait_for(self._uplink.register(), limit if limit > 0 else None)
        except TimeoutError:
            raise ConfigError(
                f"cannot register with the control plane at {self.config.url}: no answer"
                f" within {limit:g}s; check the URL and that the control plane is up"
                " (--register-timeout waits longer)"
            ) from None

    def _network(self) -> network.Network:
        """Where peers reach this worker (found again at each registration: an address
        found while the network was down would otherwise stay wrong)."""
        cfg = self.config
        return network.resolve(
            cfg.url,
            address=cfg.address,
            interface=cfg.interface,
            rendezvous_ports=cfg.rendezvous_ports,
        )

    def _registration(self) -> c.WorkerRegistration:
        vm = psutil.virtual_memory()
        self.network = self._network()
        try:
            return c.WorkerRegistration(
                name=self.name,
                hostname=socket.gethostname(),
                cpus=os.cpu_count() or 1,
                memory_bytes=vm.total,
                devices=self.devices,
                labels=self.config.labels,
                slots=self.config.slots,
                version=gpulayer.__version__,
                python=f"{sys.version_info.major}.{sys.version_info.minor}",
                running_tasks=self._running_ids(),
                acquired_seq=self._acquired_seq,
                address=self.network.address,
                rendezvous_ports=self.network.rendezvous_ports,
            )
        except pydantic.ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or 'worker'}: {err['msg']}" for err in e.errors()
            )
            raise ConfigError(f"cannot register this worker: {problems}") from e

    def _registered(self, reg: c.Registered, took: float) -> None:
        self._register_again = False
        self._lease.configure(reg.heartbeat_seconds, reg.lease_seconds)
        # It renewed the listed tasks' leases after the request that got it was sent.
        self._lease.renewed(self._lease.now() - took)
        self._kill(reg.kill_tasks)

    # --------------------------------------------------------------- loops

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lease.heartbeat_seconds)
            try:
                if self._fence is not None:
                    self._fence.check()
                if self._lease.lapsed or self._register_again:
                    # The control plane may have given our tasks away: register again
                    # (once it is back), so it hears what is left and says what to drop.
                    await self._uplink.register_again()
                else:
                    await self._heartbeat()
            except Exception:  # a loop of the agent: log and keep beating
                log.exception("heartbeat failed")

    async def _lease_loop(self) -> None:
        """Stop every task when the lease may be lost, before the control plane can
        hand the tasks to another worker; wait for a renewal, and again."""
        while True:
            await self._lease.lapse()
            since = self._lease.now() - (self._lease.renewed_at or 0.0)
            why = (
                f"no heartbeat answered for {since:.1f}s: stopped before its"
                f" {self._lease.lease_seconds:g}s lease could run out"
            )
            running = [t for t in self._tasks.values() if not t.abandoned]
            if running:
                log.warning("worker %s: %s (%d task(s))", self.name, why, len(running))
            for task in running:
                task.fence(why)
            self._register_again = True
            await self._lease.renewal()

    async def _heartbeat(self, *, retry: bool = True) -> bool:
        """Send one heartbeat; True when the control plane answered it (below 500)."""
        vm = psutil.virtual_memory()
        running = self._running_ids()
        pids = {t.run.pid: t.id for t in self._tasks.values() if t.run and t.run.pid}
        beat = c.Heartbeat(
            running_tasks=running,
            acquired_seq=self._acquired_seq,
            cpu_percent=psutil.cpu_percent(None),
            memory_used_bytes=vm.total - vm.available,
            gpus=self._gpu_telemetry.sample(),
            tasks=[self._trees.sample(task_id, pid) for pid, task_id in pids.items()],
            log_lines={t.id: t.logs.produced for t in self._tasks.values()},
            envs=await asyncio.to_thread(self._env_listing),
        )
        self._trees.forget(set(pids))
        try:
            resp = await self._uplink.call(
                "POST", "heartbeat", body=beat, worker_route=True, retry=retry
            )
        except httpx.TransportError:
            return False
        if resp.is_success:
            reply = c.HeartbeatReply.model_validate(resp.json())
            # The leases were renewed after the try that got this answer was sent
            # (not the first try, which an outage may have made long ago).
            self._lease.renewed(self._lease.now() - resp.elapsed.total_seconds())
            self._kill(reply.kill_tasks)
            self._pipeline.cancel(reply.cancel)
        elif resp.status_code < 500:
            log.warning("heartbeat refused: %s", describe(resp))
        return resp.status_code < 500

    def _env_listing(self) -> list[c.CachedEnv]:
        try:
            return self.envs.listing()
        except OSError as e:  # the cache folder went away: nothing to list
            log.warning("cannot list the env cache: %s", e)
            return []

    async def _report_env(self, task_id: str, env: c.TaskEnvironment) -> None:
        """Tell the control plane how a task's Python env is doing."""
        resp = await self._uplink.call("POST", f"tasks/{task_id}/environment", body=env)
        if not resp.is_success:
            log.info("environment report of task %s refused: %s", task_id, describe(resp))

    async def _acquire_loop(self) -> None:
        """Take assignments: pushed over the live channel while it is open, else by
        HTTP long polls (until the channel may be tried again)."""
        delay = BACKOFF_START_SECONDS
        loop = asyncio.get_running_loop()
        while True:
            if self._channel is not None and loop.time() >= self._channel_at:
                await self._serve_channel()
                if loop.time() >= self._channel_at:
                    continue  # it was open and dropped: open it again at once
            hold = _ACQUIRE_WAIT_SECONDS
            if self._channel is not None:  # back to the channel when it is due
                hold = max(1, min(hold, round(self._channel_at - loop.time())))
            params = {"wait": hold, "resync": int(self._resync_due)}
            try:
                # Not retried inside: a poll that broke may have lost its answer, so
                # the next one asks again with resync (the heartbeats warn of outages).
                resp = await self._uplink.call(
                    "POST", "acquire", params=params, worker_route=True, retry=False
                )
                if resp.is_success:
                    if resp.status_code != 204:  # 204: the hold ran out; ask again at once
                        self._dispatch(c.Acquired.model_validate(resp.json()))
                    delay = BACKOFF_START_SECONDS
                    continue
                if delay == BACKOFF_START_SECONDS:  # once per streak of refusals
                    log.warning("acquire refused: %s; retrying", describe(resp))
            except httpx.TransportError as e:
                if delay == BACKOFF_START_SECONDS:
                    log.info("acquire broke (%s: %s); polling again", type(e).__name__, e)
            except Exception:  # a loop of the agent: log, back off, poll again
                log.exception("acquire failed; retrying")
            self._resync_due = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP_SECONDS)

    async def _serve_channel(self) -> None:
        """Run the live channel until it closes. When it cannot be opened, set when to
        try again and let long polls carry the assignments meanwhile."""
        assert self._channel is not None
        loop = asyncio.get_running_loop()
        uplink = self._uplink
        opened = loop.time()
        try:
            # Its first push comes at once, with a fresh seq (docs/adr/0150).
            why = await self._channel.serve(uplink.worker_id, uplink.worker_token, self._dispatch)
        except ChannelRefused as e:
            if e.status in (401, 404):  # the control plane forgot this worker
                await uplink.register_again()
                return
            if self._channel_failures == 0:
                log.warning(
                    "worker %s: no live channel (%s); HTTP long polls, trying again every %gs",
                    self.name, e, _CHANNEL_REFUSED_RETRY_SECONDS,
                )  # fmt: skip
            self._channel_failures += 1
            self._channel_at = loop.time() + _CHANNEL_REFUSED_RETRY_SECONDS
        except ChannelUnavailable as e:
            # No answer or a reset: an outage (long polls wait it out) or a proxy that
            # drops upgrades (long polls serve); try again sooner, then less often.
            self._channel_failures += 1
            wait = min(BACKOFF_START_SECONDS * 2**self._channel_failures, 60.0)
            log.info("worker %s: channel not opened (%s); again in %.1fs", self.name, e, wait)
            self._channel_at = loop.time() + wait
        except Exception:  # a loop of the agent: log, long polls meanwhile
            log.exception("channel failed")
            self._channel_at = loop.time() + BACKOFF_CAP_SECONDS
            self._resync_due = True
        else:
            if self._channel_failures:
                log.info("worker %s: live channel open again", self.name)
            self._channel_failures = 0
            log.info("worker %s: channel closed (%s); opening it again", self.name, why)
            if loop.time() - opened < 1.0:  # closed as soon as opened: never spin
                self._channel_at = loop.time() + BACKOFF_START_SECONDS
            self._resync_due = True  # what it pushed last may not have arrived

    def _dispatch(self, acquired: c.Acquired) -> None:
        """Take an acquire answer in. The first answer since an acquire path broke
        (asked with resync) is followed by a heartbeat at once: it lists every task
        this worker has, with this answer's seq, so the control plane sends back to
        the queue any task whose answer was lost with the old path, without waiting
        for its lease (docs/adr/0150)."""
        # Heartbeats built from now on list this answer's tasks (docs/api.md).
        self._acquired_seq = max(self._acquired_seq or 0, acquired.seq)
        self._pipeline.take(acquired)
        if self._resync_due:
            self._resync_due = False
            beat = asyncio.get_running_loop().create_task(self._resync_beat())
            self._beats.add(beat)
            beat.add_done_callback(self._beats.discard)

    async def _resync_beat(self) -> None:
        try:
            await self._heartbeat(retry=False)
        except Exception:  # the heartbeat loop beats again anyway
            log.exception("heartbeat after a resync failed")

    def _running_ids(self) -> list[str]:
        """Tasks whose results are not delivered yet (their leases must stay alive)."""
        return [task_id for task_id, task in self._tasks.items() if not task.abandoned]

    def _kill(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            if task := self._tasks.get(task_id):
                task.abandon("the control plane gave up on it")


async def run_agent(
    config: AgentConfig,
    stop: asyncio.Event | None = None,
    *,
    token: Callable[[], str] | None = None,
) -> None:
    """Register, heartbeat, acquire and run tasks until ``stop`` is set (or, when
    ``stop`` is None, until SIGINT or SIGTERM sets it).

    ``token``, when given, reads the join token in place of ``config.token``; it is
    called in a thread of its own once the supervisor is started and the agent
    built, while the prestarted runners start, so that a worker started beside its
    control plane (``gpulayer up``, which hands the token over once it exists) does
    all that while the control plane starts. A task user is checked by its
    prestarted runner coming up, else by a probe (ADR 0158), before registering.

    Raises
    ------
    ValueError
        If ``GPULAYER_SIMULATED_GPUS`` is malformed.
    GpulayerError
        If the worker cannot be described or the first registration is rejected.
    ConfigError
        If the URL is ``http://`` to another machine without ``config.insecure``, or
        if its task user cannot be had or cannot run this Python (one line).
    """
    tls.refuse_clear_text(config.url, config.insecure, "pass --insecure")
    user = await asyncio.to_thread(task_user.resolve, config.task_user, check=False)
    spawning.use_task_user(user)
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    timeout = httpx.Timeout(_ACQUIRE_WAIT_SECONDS + 15.0, connect=5.0)
    # Before anything starts a process: every task process carries the fence's mark.
    fence = Fence.start()
    try:
        if stop is None:
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, stop.set)
                    installed.append(sig)
                except (ValueError, RuntimeError, NotImplementedError) as e:  # not the main thread
                    log.debug("cannot handle %s: %s", sig.name, e)
        verify = tls.for_httpx(tls.verify_for(config.url, config.fingerprint), config.url)
        async with httpx.AsyncClient(timeout=timeout, verify=verify) as http:
            agent = Agent(config, http, fence)
            # The token is read in a thread of its own, while the agent prepares
            # (its runners start): a stop while it waits ends the worker without it.
            later = None if token is None else in_daemon_thread(token)
            serving = asyncio.create_task(agent.serve(later), name="gpulayer-worker")
            stopping = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                serving.cancel()
                if later is not None:
                    later.cancel()  # a token that comes now is nobody's
                try:
                    with contextlib.suppress(asyncio.CancelledError):
                        await serving  # re-raises a failed first registration
                finally:
                    await agent.shutdown()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if fence is not None:
            await asyncio.to_thread(fence.close)  # kills what is left of the tasks
        spawning.use_task_user(None)  # this process may go on (an agent run in-process)
    log.info("worker stopped")


def main(config: AgentConfig, token: Callable[[], str] | None = None) -> int:
    """Run the agent until SIGINT or SIGTERM; the exit code of ``gpulayer join``
    (``token``: see :func:`run_agent`)."""
    asyncio.run(run_agent(config, token=token))
    return 0
