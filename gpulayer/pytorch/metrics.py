"""Logged metrics: kept on the device during a step, read at log points, handed to sinks.

``Module.log(name, value)`` stores a *detached* tensor (or a Python number) in a
:class:`MetricCollector`; nothing is copied to the host then, so logging every
step costs no device synchronisation. At a log point (every
``log_every_n_steps`` optimizer steps, and at the end of each epoch) the trainer
asks the collector for its values: they are stacked, averaged over ranks with one
all-reduce per reduction kind and read with one ``.tolist()``. The result is a
:class:`MetricRecord` handed to every :class:`MetricSink`.

Sinks
-----
:class:`HistorySink`
    always on: ``trainer.history``, a list of ``(step, metrics)``.
:class:`JsonlSink`
    on the main rank when ``GPULAYER_METRICS_FILE`` is set: one JSON object per
    line, ``{"step", "epoch", "rank", "ts", "metrics"}``, appended and flushed at
    each log point, so a reader (the worker agent) can follow the file.

A sink is anything with ``write(record)`` and ``close()``.
"""

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TextIO

import torch

from gpulayer.pytorch.runtime import Runtime

#: The variable naming the JSON-lines file that :class:`JsonlSink` appends to.
METRICS_FILE_ENV = "GPULAYER_METRICS_FILE"

Reduce = Literal["mean", "sum", "max", "min"]
Number = torch.Tensor | float | int


@dataclass(frozen=True)
class MetricRecord:
    """The metrics of one log point: reduced over ranks, or one rank's own values
    (``Trainer(log_rank_metrics=True)``; the reduced record then has ``rank=None``)."""

    step: int
    epoch: int
    rank: int | None
    metrics: dict[str, float]
    ts: float = field(default_factory=time.time)

    def to_json(self) -> str:
        """One line of the metrics file (no newline)."""
        record = {"step": self.step, "epoch": self.epoch, "rank": self.rank, "ts": self.ts}
        return json.dumps({**record, "metrics": self.metrics})


class MetricSink(Protocol):
    """Where the trainer sends the metrics of each log point."""

    def write(self, record: MetricRecord) -> None:
        """Take one record; called on the ranks the sink was given to."""

    def close(self) -> None:
        """Release resources at the end of ``fit``/``validate``/``test``."""


class HistorySink:
    """Keeps every record in memory: ``trainer.history`` is ``[(step, metrics), ...]``."""

    def __init__(self) -> None:
        self.records: list[MetricRecord] = []

    def write(self, record: MetricRecord) -> None:
        """Append the record."""
        self.records.append(record)

    def close(self) -> None:
        """Nothing to release."""


class JsonlSink:
    """Appends each record as one JSON line to ``path`` and flushes it.

    Parameters
    ----------
    path
        The file; created (with its parents) on first write, appended to after.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = None

    @classmethod
    def from_env(cls) -> "JsonlSink | None":
        """A sink for ``$GPULAYER_METRICS_FILE``, or ``None`` when it is unset."""
        path = os.environ.get(METRICS_FILE_ENV)
        return cls(path) if path else None

    def write(self, record: MetricRecord) -> None:
        """Append ``record`` as one line."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(record.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file (a later write opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class _Entry:
    """One logged name: its last step value and its running epoch aggregate."""

    __slots__ = ("epoch_total", "epoch_weight", "fresh", "on_epoch", "on_step", "prog_bar",
                 "reduce", "step_value")  # fmt: skip

    def __init__(self, on_step: bool, on_epoch: bool, prog_bar: bool, reduce: Reduce) -> None:
        self.on_step, self.on_epoch = on_step, on_epoch
        self.prog_bar, self.reduce = prog_bar, reduce
        self.step_value: Number | None = None
        self.epoch_total: Number | None = None
        self.epoch_weight = 0.0
        self.fresh = False


class MetricCollector:
    """The metrics logged in one stage (train, validate, test) of a run.

    Values stay where they were computed until :meth:`read_step` or
    :meth:`read_epoch` reads them.
    """

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        #: Names (as :meth:`read_step`/:meth:`read_epoch` return them) for the progress bar.
        self.prog_bar: set[str] = set()

    def log(
        self,
        name: str,
        value: Number,
        *,
        on_step: bool,
        on_epoch: bool,
        prog_bar: bool = False,
        reduce: Reduce = "mean",
        weight: float = 1.0,
    ) -> None:
        """Record ``value`` for ``name`` (hot path: no host-device copy)."""
        entry = self.entries.get(name)
        if entry is None:
            if reduce not in ("mean", "sum", "max", "min"):
                raise ValueError(f"reduce must be mean, sum, max or min, not {reduce!r}")
            entry = self.entries[name] = _Entry(on_step, on_epoch, prog_bar, reduce)
            if prog_bar:
                both = on_step and on_epoch
                self.prog_bar.update((f"{name}_step", f"{name}_epoch") if both else (name,))
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"{name!r}: log a scalar, not a tensor of shape {tuple(value.shape)}"
                )
            # Detached (no graph kept alive), float32 for the sums, still on its device.
            value = value.detach().float()
            if value.dim():
                value = value.reshape(())
        if entry.on_step:
            entry.step_value = value
            entry.fresh = True
        if entry.on_epoch:
            entry.epoch_total = _accumulate(entry, value, weight)
            entry.epoch_weight += weight

    def read_step(
        self, runtime: Runtime, local: dict[str, float] | None = None
    ) -> dict[str, float]:
        """The step values logged since the last call, reduced over ranks (and, into
        ``local`` when given, this rank's own values)."""
        values: dict[str, tuple[Number | None, str]] = {}
        for name, entry in self.entries.items():
            if entry.fresh:
                key = f"{name}_step" if entry.on_epoch else name
                values[key] = (entry.step_value, entry.reduce)
                entry.fresh = False
        return _reduce(values, runtime, local)

    def read_epoch(
        self, runtime: Runtime, local: dict[str, float] | None = None
    ) -> dict[str, float]:
        """The epoch aggregates, reduced over ranks (and, into ``local`` when given,
        this rank's own); then forget them."""
        values: dict[str, tuple[Number | None, str]] = {}
        weights: dict[str, tuple[Number | None, str]] = {}
        for name, entry in self.entries.items():
            if entry.on_epoch and entry.epoch_total is not None:
                key = f"{name}_epoch" if entry.on_step else name
                op = "sum" if entry.reduce == "mean" else entry.reduce
                values[key] = (entry.epoch_total, op)
                if entry.reduce == "mean":
                    weights[key] = (entry.epoch_weight, "sum")
        # A weighted mean over ranks is sum(totals) / sum(weights): one reduction.
        mine: dict[str, float] | None = None if local is None else {}
        merged = _reduce({**values, **{f"\0{k}": v for k, v in weights.items()}}, runtime, mine)
        out = {k: merged[k] for k in values}
        for key in weights:
            out[key] = out[key] / merged[f"\0{key}"]
        if local is not None and mine is not None:
            local.update({k: mine[k] for k in values})
            for key in weights:
                local[key] = local[key] / mine[f"\0{key}"] if mine[f"\0{key}"] else math.nan
        self.reset()
        return out

    def reset(self) -> None:
        """Forget every value and the names' settings (not :attr:`prog_bar`)."""
        self.entries.clear()


def _accumulate(entry: _Entry, value: Number, weight: float) -> Number:
    total = entry.epoch_total
    if entry.reduce == "mean":
        value = value if weight == 1.0 else value * weight
        return value if total is None else total + value
    if entry.reduce == "sum":
        return value if total is None else total + value
    if total is None:
        return value
    if isinstance(value, torch.Tensor) or isinstance(total, torch.Tensor):
        pick = torch.maximum if entry.reduce == "max" else torch.minimum
        return pick(torch.as_tensor(total, device=_device_of(value, total)),
                    torch.as_tensor(value, device=_device_of(value, total)))  # fmt: skip
    return max(total, value) if entry.reduce == "max" else min(total, value)


def _device_of(*values: Number) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


def _reduce(
    values: dict[str, tuple[Number | None, str]],
    runtime: Runtime,
    local: dict[str, float] | None = None,
) -> dict[str, float]:
    """Reduce named scalars over ranks, one all-reduce per op, one host copy per op
    (two when ``local`` asks for this rank's own values too).

    Every rank must log the same names, or the collectives would not match.
    """
    out: dict[str, float] = {}
    for op in ("mean", "sum", "max", "min"):
        names = sorted(k for k, (_, o) in values.items() if o == op)
        if not names:
            continue
        if not runtime.is_distributed and all(
            not isinstance(values[n][0], torch.Tensor) for n in names
        ):
            out.update({n: float(values[n][0]) for n in names})  # type: ignore[arg-type]
            if local is not None:
                local.update({n: out[n] for n in names})
            continue
        stacked = _stack([values[n][0] for n in names], runtime.device)
        if local is not None:
            local.update(zip(names, stacked.tolist(), strict=True))
        runtime.all_reduce(stacked, op)
        out.update(zip(names, stacked.tolist(), strict=True))
    return out


def _stack(items: Iterable[Number | None], device: torch.device) -> torch.Tensor:
    tensors = [
        v.to(device)
        if isinstance(v, torch.Tensor)
        else torch.tensor(float(v or 0.0), device=device)
        for v in items
    ]
    return torch.stack(tensors)
