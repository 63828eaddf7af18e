"""What the autoscaler tells everyone else: pure, in memory, no I/O.

:class:`Board` is written by the autoscaler (``autoscaler.py``) and read by
placement and the job reads: which queued job waits for which instance
(``Job.provisioning``, "provisioning: slurm job 1234 pending (Resources) in
partition gpu"), which job a provider refused with its own message (the job is
unsatisfiable, saying why), when an allocation ends (no task is placed on a worker
whose allocation ends before the task's timeout), and which offers could ever run
a job (a job no registered worker fits is not unsatisfiable while an offer fits).
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpulayer.contracts import (
    Device,
    InstanceState,
    JobSpec,
    JobState,
    Offer,
    Placement,
    Provisioning,
    Resources,
    WorkerState,
    format_duration,
)

from .placement import WorkerView, static_misfit
from .store import RunSpan


def offer_view(offer: Offer, labels: dict[str, str], res: Resources | None = None) -> WorkerView:
    """A worker as ``offer`` would register it (for an offer sized to the job, with
    the job's GPUs: up to the offer's, or any number when the offer sets none)."""
    gpus = offer.gpus
    if offer.sized_to_job and res is not None and (offer.gpus == 0 or res.gpus <= offer.gpus):
        gpus = res.gpus
    name = f"{offer.gpu_model or 'GPU'}"
    devices = tuple(
        Device(index=i, kind=offer.accelerator, name=name,
               memory_bytes=offer.gpu_memory_bytes or (res.gpu_memory or 0 if res else 0))
        for i in range(gpus)
    )  # fmt: skip
    unknown_memory = offer.memory_bytes == 0 and res is not None and res.memory is not None
    return WorkerView(
        id="", name="", state=WorkerState.ready,
        cpus=max(offer.cpus, math.ceil(res.cpus) if res is not None and offer.sized_to_job else 0),
        memory_bytes=int(res.memory or 0) if unknown_memory and res else offer.memory_bytes,
        slots=1, labels=labels, devices=devices,
    )  # fmt: skip


def offer_fits(offer: Offer, labels: dict[str, str], spec: JobSpec) -> bool:
    """Whether an instance of ``offer`` could run ``spec`` (a gang: on ``nodes`` nodes)."""
    res = spec.resources
    if res.worker is not None or spec.nodes > offer.max_nodes:
        return False
    return static_misfit(res, offer_view(offer, labels, res)) is None


def job_cost(spans: Iterable[RunSpan], now: float) -> float:
    """A job's share of the instances it ran on: each task's wall time x the
    instance's price x its share of the instance's GPUs (all of a GPU-less one)."""
    total = 0.0
    for s in spans:
        seconds = max(0.0, (s.ended_at or now) - s.started_at)
        share = min(1.0, max(s.gpus, 1) / max(s.instance_gpus, 1))
        total += s.price_per_hour * math.ceil(seconds) / 3600.0 * share
    return round(total, 6)


@dataclass
class Board:
    """See the module docstring."""

    notes: dict[str, Provisioning] = field(default_factory=dict)  # job id -> instance
    refusals: dict[str, str] = field(default_factory=dict)  # job id -> provider's words
    ends_at: dict[str, float] = field(default_factory=dict)  # worker name -> allocation end
    offers: list[tuple[Offer, dict[str, str]]] = field(default_factory=list)  # with labels

    def announce(
        self, instance_id: str, provider: str, detail: str, job_ids: Iterable[str]
    ) -> None:
        """Note at once (before the instance is even recorded) that ``job_ids`` wait
        for a new instance, so no read sees the instance without the jobs' note, or the
        jobs still pointing at an instance that ended; the autoscaler's next round
        publishes the whole board again."""
        for job_id in job_ids:
            self.notes[job_id] = Provisioning(
                instance_id=instance_id, provider=provider, state=InstanceState.provisioning,
                detail=detail,
            )  # fmt: skip

    def could_provision(self, spec: JobSpec) -> bool:
        """Whether some configured offer could run ``spec``."""
        return any(offer_fits(o, labels, spec) for o, labels in self.offers)

    def time_left_fits(self, worker_name: str, spec: JobSpec, now: float) -> bool:
        """False when ``worker_name``'s allocation ends before ``spec``'s timeout would."""
        end = self.ends_at.get(worker_name)
        return end is None or spec.timeout is None or end - now >= spec.timeout

    def annotate(self, job_id: str, spec: JobSpec, report: Placement, now: float) -> Placement:
        """A queued job's placement report with what the providers do about it."""
        fits = [
            w if self.time_left_fits(w.worker, spec, now) or not w.could_ever_fit
            else w.model_copy(update={"fits": False, "reason": self._short(w.worker, spec, now)})
            for w in report.workers
        ]  # fmt: skip
        update: dict[str, object] = {"workers": fits}
        note = self.notes.get(job_id)
        if note is not None:
            update |= {"satisfiable": True, "summary": f"provisioning: {note.detail}"
                       f" (instance {note.instance_id} on {note.provider})"}  # fmt: skip
        elif not report.satisfiable and job_id in self.refusals:
            update["summary"] = f"unsatisfiable: {self.refusals[job_id]}"
        elif not report.satisfiable and self.could_provision(spec):
            summary = "no registered worker fits; a provider will start one"
            update |= {"satisfiable": True, "summary": summary}
        return report.model_copy(update=update)

    def _short(self, worker: str, spec: JobSpec, now: float) -> str:
        left = format_duration(max(0.0, self.ends_at[worker] - now))
        return (
            f"its allocation ends in {left}, before the job's timeout"
            f" ({format_duration(spec.timeout or 0)})"
        )

    def queued_note(self, job_id: str, state: JobState) -> Provisioning | None:
        """The note of a job while it is queued."""
        return self.notes.get(job_id) if state == JobState.queued else None
