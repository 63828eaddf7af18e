"""Prometheus metrics: ``GET /gpulayer/metrics`` in the text exposition format.

Two kinds of series, both in a registry of the app's own (never the process-wide
default one, so several control planes in one process, as in the tests, do not
collide):

- **Gauges computed at scrape time** by :class:`StateCollector` from the store and
  the fleet: jobs by state, queue depth, workers by state, GPUs and their latest
  readings. The handler awaits :meth:`StateCollector.refresh` (the store is async)
  and prometheus-client's synchronous ``collect`` then reads that snapshot.
- **Histograms and counters observed where things happen** (:class:`Instruments`,
  held by the scheduler): how long jobs wait for placement, how long placed tasks
  wait for their worker to pick them up, and how many log lines were stored.

Names follow STYLE.md: ``gpulayer_<noun>_<unit>`` for gauges and histograms,
``..._total`` for counters. The route is in ``api/prometheus.py``. (Training
metric points, the other "metrics", are ``training_metrics.py``.)
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gpulayer.contracts import JobState, Worker, WorkerState

if TYPE_CHECKING:  # the core holds the instruments; the collector reads the core's parts
    from .channels import Channels
    from .fleet import Fleet
    from .store import Store

#: Buckets for waits that range from milliseconds (an idle cluster) to hours (a full one).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class Instruments:
    """The histograms and counters the scheduler observes, in ``registry``.

    Without a registry (a scheduler built directly, as unit tests do) they are
    kept but exported nowhere.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.placement_latency = Histogram(
            "gpulayer_placement_latency_seconds",
            "Seconds a job waited in the queue before it was placed on a worker.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.dispatch_latency = Histogram(
            "gpulayer_dispatch_latency_seconds",
            "Seconds from a task's placement until its worker picked it up.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.log_lines = Counter(
            "gpulayer_log_lines_ingested",
            "Log lines stored (lines a worker sent twice are counted once).",
            registry=registry,
        )


@dataclass
class Snapshot:
    """What the gauges show, read from the store and fleet at one scrape."""

    jobs: dict[str, int] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    #: worker id -> indices of its GPUs held by scheduled or running tasks
    reserved: dict[str, set[int]] = field(default_factory=dict)
    #: provider instances: (provider, state) -> count, and provider -> cost so far
    instances: dict[tuple[str, str], int] = field(default_factory=dict)
    instance_cost: dict[str, float] = field(default_factory=dict)


class StateCollector:
    """Gauges of the control plane's current state, computed at each scrape."""

    def __init__(self, store: "Store", fleet: "Fleet", channels: "Channels | None" = None) -> None:
        self.store = store
        self.fleet = fleet
        self.channels = channels
        self.snapshot = Snapshot()

    async def refresh(self) -> None:
        """Read the store and the fleet (called by the handler before ``collect``)."""
        store = self.store
        jobs = {s.value: await store.count_jobs([s]) for s in JobState}
        reserved: dict[str, set[int]] = {}
        for t in await store.active_tasks():
            reserved.setdefault(t.worker_id or "", set()).update(t.gpu_indices)
        counts: dict[tuple[str, str], int] = {}
        cost: dict[str, float] = {}
        now = time.time()
        for inst in await store.list_instances(limit=10_000):
            key = (inst.provider, inst.state.value)
            counts[key] = counts.get(key, 0) + 1
            cost[inst.provider] = cost.get(inst.provider, 0.0) + inst.cost(now)
        self.snapshot = Snapshot(
            jobs=jobs, workers=await self.fleet.workers(), reserved=reserved,
            instances=counts, instance_cost=cost,
        )  # fmt: skip

    def describe(self) -> list[Metric]:
        """Nothing to check for name clashes up front (the names are fixed below)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The gauges of the last :meth:`refresh`."""
        snap = self.snapshot
        jobs = GaugeMetricFamily("gpulayer_jobs", "Jobs by state.", labels=["state"])
        for state, n in snap.jobs.items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily(
            "gpulayer_queue_depth",
            "Jobs waiting for placement.",
            value=snap.jobs.get(JobState.queued.value, 0),
        )
        workers = GaugeMetricFamily("gpulayer_workers", "Workers by state.", labels=["state"])
        for state in WorkerState:
            workers.add_metric([state.value], sum(w.state == state for w in snap.workers))
        yield workers
        if self.channels is not None:  # read now: a count in memory, nothing to await
            yield GaugeMetricFamily(
                "gpulayer_channels",
                "Live channels (WebSockets) of clients and workers open now.",
                value=self.channels.count(),
            )
        yield from self._gpus(snap)
        yield from self._instances(snap)

    def _instances(self, snap: Snapshot) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "gpulayer_instances", "Provider instances by provider and state.",
            labels=["provider", "state"],
        )  # fmt: skip
        for (provider, state), n in sorted(snap.instances.items()):
            gauge.add_metric([provider, state], n)
        yield gauge
        cost = GaugeMetricFamily(
            "gpulayer_instance_cost_dollars", "Price x wall time of each provider's instances.",
            labels=["provider"],
        )  # fmt: skip
        for provider, dollars in sorted(snap.instance_cost.items()):
            cost.add_metric([provider], dollars)
        yield cost

    def _gpus(self, snap: Snapshot) -> Iterator[Metric]:
        labels = ["worker", "gpu", "model"]
        util = GaugeMetricFamily(
            "gpulayer_gpu_utilization_percent", "Latest GPU utilization reading.", labels=labels
        )
        used = GaugeMetricFamily(
            "gpulayer_gpu_memory_used_bytes", "Latest GPU memory in use.", labels=labels
        )
        total = GaugeMetricFamily(
            "gpulayer_gpu_memory_total_bytes", "GPU memory of each device.", labels=labels
        )
        held = GaugeMetricFamily(
            "gpulayer_gpu_reserved", "1 while a task holds the GPU, else 0.", labels=labels
        )
        n_total = n_held = 0
        for w in snap.workers:
            readings = {g.index: g for g in w.gpus}
            mine = snap.reserved.get(w.id, set())
            for d in w.devices:
                key = [w.name, str(d.index), d.name]
                total.add_metric(key, d.memory_bytes)
                held.add_metric(key, int(d.index in mine))
                g = readings.get(d.index)
                if g is not None and g.utilization_percent is not None:
                    util.add_metric(key, g.utilization_percent)
                if g is not None and g.memory_used_bytes is not None:
                    used.add_metric(key, g.memory_used_bytes)
                # Offline workers' GPUs cannot be used; they are not counted as capacity.
                if w.state != WorkerState.offline:
                    n_total += 1
                    n_held += d.index in mine
        yield from (util, used, total, held)
        yield GaugeMetricFamily(
            "gpulayer_gpus", "GPUs of workers that are not offline.", value=n_total
        )
        yield GaugeMetricFamily(
            "gpulayer_gpus_reserved", "GPUs held by scheduled or running tasks.", value=n_held
        )


def make_registry() -> tuple[CollectorRegistry, Instruments]:
    """A registry of the app's own with its instruments; :class:`StateCollector`
    joins it once the store and the fleet exist (:func:`add_state`)."""
    registry = CollectorRegistry()
    GCCollector(registry=registry)  # python_gc_*: the collector's passes (ADR 0147)
    return registry, Instruments(registry)


def add_state(
    registry: CollectorRegistry, store: "Store", fleet: "Fleet", channels: "Channels | None" = None
) -> StateCollector:
    """Register the state gauges of ``store``, ``fleet`` and ``channels`` in ``registry``."""
    state = StateCollector(store, fleet, channels)
    registry.register(state)
    return state
