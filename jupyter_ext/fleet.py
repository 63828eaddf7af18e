"""The fleet: registered workers as placement sees them, and their recent readings.

Worker registrations change only when a worker registers, so each is parsed into a
:class:`~jupyter_ext.placement.WorkerView` once and cached by (registration,
state). Heartbeat readings live in memory, in a bounded window per worker: they
are for watching a worker now, not history, and are gone after a restart.
"""

from collections import defaultdict, deque

from gpulayer.contracts import Heartbeat, Telemetry, TelemetrySample, Worker
from gpulayer.errors import NotFound

from .placement import WorkerView
from .store import Store, WorkerRecord, as_datetime


class Fleet:
    """Parsed worker views and telemetry windows, on top of the store."""

    def __init__(self, store: Store, telemetry_samples: int = 360) -> None:
        self.store = store
        self._views: dict[str, tuple[tuple[str, str], WorkerView]] = {}
        # task id -> log lines its worker last said it produced (in memory: a
        # restarted control plane learns them again from the next heartbeat).
        self._produced: dict[str, int] = {}
        self._telemetry: dict[str, deque[TelemetrySample]] = defaultdict(
            lambda: deque(maxlen=telemetry_samples)
        )

    async def views(self) -> list[WorkerView]:
        """Every worker, parsed, with its current state."""
        out = []
        for row in await self.store.list_workers():
            key = (row.info_json, row.state)
            cached = self._views.get(row.id)
            if cached is None or cached[0] != key:
                cached = self._views[row.id] = (key, WorkerView.from_record(row))
            out.append(cached[1])
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

    def record(self, worker_id: str, ts: float, hb: Heartbeat) -> None:
        """Keep one heartbeat's readings (and how many log lines each task produced)."""
        self._produced.update(hb.log_lines)
        self._telemetry[worker_id].append(
            TelemetrySample(
                ts=as_datetime(ts),
                cpu_percent=hb.cpu_percent,
                memory_used_bytes=hb.memory_used_bytes,
                gpus=hb.gpus,
                tasks=hb.tasks,
            )
        )

    def lines_produced(self, task_id: str) -> int | None:
        """The log lines ``task_id`` produced by its worker's last heartbeat (None:
        never reported); forgotten here, as the task is ending."""
        return self._produced.pop(task_id, None)

    async def workers(self) -> list[Worker]:
        """Every worker with its running tasks and its latest readings."""
        running: dict[str, list[str]] = defaultdict(list)
        for t in await self.store.active_tasks():
            running[t.worker_id or ""].append(t.id)
        out = []
        for r in await self.store.list_workers():
            w = r.model(running[r.id])
            if samples := self._telemetry.get(r.id):
                w.gpus, w.tasks = samples[-1].gpus, samples[-1].tasks
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
        samples = list(self._telemetry.get(row.id, ()))
        return Telemetry(worker_id=row.id, worker_name=row.name, samples=samples)

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
