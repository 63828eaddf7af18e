"""The fleet: registered workers as placement sees them, and their recent readings.

Worker registrations change only when a worker registers, so each is parsed into a
:class:`~jupyter_ext.placement.WorkerView` once and cached by (registration,
state), and the whole list is read again only after a commit changed a worker's
registration, name or state (``Store.workers_generation``), not on every
placement. Heartbeat readings live in memory, in a bounded window per worker: they
are for watching a worker now, not history, and are gone after a restart.
"""

from collections import defaultdict, deque

from gpulayer.contracts import CachedEnv, Heartbeat, Telemetry, TelemetrySample, Worker
from gpulayer.errors import NotFound

from .placement import WorkerView
from .store import Store, WorkerRecord, as_datetime


class Fleet:
    """Parsed worker views and telemetry windows, on top of the store."""

    def __init__(
        self, store: Store, telemetry_samples: int = 900, telemetry_bytes: int = 4 * 1024 * 1024
    ) -> None:
        self.store = store
        self._views: dict[str, tuple[tuple[str, str], WorkerView]] = {}
        self._listed: tuple[int, list[WorkerView]] | None = None  # (generation, views)
        self._listed_ids: frozenset[str] = frozenset()  # the ids of _listed's views
        # worker id -> task id -> log lines the worker last said it produced (in
        # memory, replaced by each heartbeat, so bounded by what one heartbeat may
        # list; a restarted control plane learns them again from the next one).
        self._produced: dict[str, dict[str, int]] = {}
        self._telemetry: dict[str, deque[tuple[TelemetrySample, int]]] = defaultdict(
            lambda: deque(maxlen=telemetry_samples)
        )
        self._telemetry_bytes = telemetry_bytes
        self._window_bytes: dict[str, int] = defaultdict(int)
        # worker id -> the envs its last heartbeat listed (bounded by the contract).
        self._envs: dict[str, list[CachedEnv]] = {}

    async def views(self) -> list[WorkerView]:
        """Every worker, parsed, with its current state."""
        return list(await self._current())

    async def require(self, worker_id: str) -> None:
        """Raise :class:`NotFound` unless ``worker_id`` is registered, as :meth:`get`
        does, from the views (each acquire asks; no read unless a worker changed)."""
        await self._current()
        if worker_id not in self._listed_ids:
            raise NotFound(f"no worker with id {worker_id!r}; register again")

    async def _current(self) -> list[WorkerView]:
        """The views, read again only after a commit changed a worker (not a copy)."""
        generation = self.store.workers_generation
        if self._listed is not None and self._listed[0] == generation:
            return self._listed[1]
        out = []
        for row in await self.store.list_workers():
            key = (row.info_json, row.state)
            cached = self._views.get(row.id)
            if cached is None or cached[0] != key:
                cached = self._views[row.id] = (key, WorkerView.from_record(row))
            out.append(cached[1])
        self._listed = (generation, out)  # a commit meanwhile counted up: read again
        self._listed_ids = frozenset(w.id for w in out)
        return out

    async def all_names(self) -> dict[str, str]:
        """Every worker's name by id."""
        return {w.id: w.name for w in await self.views()}

    async def names(self, ids: set[str | None]) -> dict[str, str]:
        """Worker names by id, for ``ids`` (None ignored): from the views already
        parsed when they know every one, else read again."""
        known = {wid: view.name for wid, (_, view) in self._views.items()}
        if not all(i in known for i in ids if i is not None):
            known = {w.id: w.name for w in await self.views()}
        return known

    def forget(self, worker_id: str) -> None:
        """Drop what is kept in memory about a worker that was forgotten."""
        self._views.pop(worker_id, None)
        self._listed = None
        self._telemetry.pop(worker_id, None)
        self._produced.pop(worker_id, None)
        self._envs.pop(worker_id, None)

    def record(self, worker_id: str, ts: float, hb: Heartbeat) -> None:
        """Keep one heartbeat's readings; the oldest go once the window holds more
        than ``telemetry_samples`` samples or ``telemetry_bytes`` (their JSON size); and
        how many log lines each task produced."""
        self._produced[worker_id] = dict(hb.log_lines)
        self._envs[worker_id] = list(hb.envs)
        sample = TelemetrySample(
            ts=as_datetime(ts),
            cpu_percent=hb.cpu_percent,
            memory_used_bytes=hb.memory_used_bytes,
            gpus=hb.gpus,
            tasks=hb.tasks,
        )
        size = len(sample.model_dump_json())
        window = self._telemetry[worker_id]
        if len(window) == window.maxlen and window:
            self._window_bytes[worker_id] -= window[0][1]  # append() drops it
        window.append((sample, size))
        self._window_bytes[worker_id] += size
        while len(window) > 1 and self._window_bytes[worker_id] > self._telemetry_bytes:
            self._window_bytes[worker_id] -= window.popleft()[1]

    def samples(self, worker_id: str) -> list[TelemetrySample]:
        """A worker's telemetry window, oldest first."""
        return [sample for sample, _ in self._telemetry.get(worker_id, ())]

    def window_bytes(self, worker_id: str) -> int:
        """The JSON size of a worker's telemetry window."""
        return self._window_bytes.get(worker_id, 0)

    def lines_produced(self, worker_id: str | None, task_id: str) -> int | None:
        """The log lines ``task_id`` produced by its worker's last heartbeat (None:
        never reported); forgotten here, as the task is ending."""
        return self._produced.get(worker_id or "", {}).pop(task_id, None)

    async def workers(self) -> list[Worker]:
        """Every worker with its running tasks and its latest readings."""
        running: dict[str, list[str]] = defaultdict(list)
        for t in await self.store.active_tasks():
            running[t.worker_id or ""].append(t.id)
        out = []
        for r in await self.store.list_workers():
            w = r.model(running[r.id])
            if samples := self._telemetry.get(r.id):
                w.gpus, w.tasks = samples[-1][0].gpus, samples[-1][0].tasks
            w.envs = self._envs.get(r.id, [])
            out.append(w)
        return out

    async def telemetry(self, name: str) -> Telemetry:
        """A worker's readings (by name or id), oldest first.

        Raises
        ------
        NotFound
            For an unknown worker.
        """
        row = await self.store.find_worker(name)
        return Telemetry(worker_id=row.id, worker_name=row.name, samples=self.samples(row.id))

    async def get(self, worker_id: str) -> WorkerRecord:
        """A registered worker by id.

        Raises
        ------
        NotFound
            For an unknown id (the worker must register again).
        """
        row = await self.store.get_worker(worker_id)
        if row is None:
            raise NotFound(f"no worker with id {worker_id!r}; register again")
        return row
