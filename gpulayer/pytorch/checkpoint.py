"""Checkpoint files: what they hold, and writing them so a crash never leaves half a file.

A checkpoint is a dict saved with :func:`torch.save`::

    format           1
    epoch            the epoch the run was in
    global_step      optimizer steps so far
    batches_done     batches of ``epoch`` already trained
    epoch_finished   True when ``epoch``'s training batches were all done
    state_dict       the module's parameters and buffers
    optimizer        optimizer.state_dict()
    lr_scheduler     scheduler.state_dict(), or None
    precision        the GradScaler's state under "16-mixed", else {}
    callbacks        {callback.state_key: callback.state_dict()}
    rng              random number generator states (see below)

The RNG states are those at the start of the epoch (``rng["epoch_start"]``, from
which the shuffling of the data loader was drawn) and at the moment of saving
(``rng["now"]``); resuming replays the order of the interrupted epoch and then
continues with the same random stream, so an interrupted and resumed run
computes what an uninterrupted one does. Files are read with
``weights_only=True``: add only tensors and plain Python values in
``on_save_checkpoint``.
"""

import os
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpulayer.pytorch.precision import Precision

FORMAT = 1


class Stateful(Protocol):
    """What a checkpoint keeps of a callback: its ``state_dict`` under its ``state_key``."""

    @property
    def state_key(self) -> str: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Position:
    """Where a run stands in its loop (see the fields of the module docstring)."""

    epoch: int
    global_step: int
    batches_done: int
    epoch_finished: bool


@dataclass(frozen=True)
class Resume:
    """A fit resumed in the middle of an epoch: its first ``batches_done`` batches are
    drawn again from ``epoch_rng`` and skipped, then ``now_rng`` continues."""

    batches_done: int
    epoch_rng: dict[str, Any]
    now_rng: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    """The states of Python's, torch's (CPU and CUDA) and, if loaded, numpy's global RNGs."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    # torch leaves cuda.is_initialized unannotated
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached)
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng` returned."""
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value


def save(checkpoint: dict[str, Any], path: str | Path) -> Path:
    """Write ``checkpoint`` to ``path`` atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)
    return path


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU.

    Raises
    ------
    ValueError
        If the file is not a gpulayer checkpoint of a known format.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{path} is not a gpulayer checkpoint (format {FORMAT})")
    return checkpoint


def check_state_keys(callbacks: Iterable[Stateful]) -> None:
    """Reject callbacks whose states a checkpoint could not tell apart.

    Raises
    ------
    ValueError
        If two of ``callbacks`` share a ``state_key``.
    """
    keys = [cb.state_key for cb in callbacks]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"callbacks share a state_key, so checkpoints could not tell them apart: "
                         f"{', '.join(duplicates)}")  # fmt: skip


def contents(
    position: Position,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: dict[str, Any] | None,
    precision: Precision,
    callbacks: Iterable[Stateful],
    epoch_rng: dict[str, Any] | None,
) -> dict[str, Any]:
    """The checkpoint of a run at ``position`` (``epoch_rng``: the RNG states at the
    start of its epoch, when known)."""
    return {
        "format": FORMAT,
        "epoch": position.epoch,
        "global_step": position.global_step,
        "batches_done": position.batches_done,
        "epoch_finished": position.epoch_finished,
        "state_dict": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler["scheduler"].state_dict() if lr_scheduler else None,
        "precision": precision.state_dict(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in callbacks},
        "rng": {"epoch_start": epoch_rng or capture_rng(), "now": capture_rng()},
    }


def restore_states(
    checkpoint: dict[str, Any],
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: dict[str, Any] | None,
    precision: Precision,
    callbacks: Iterable[Stateful],
) -> None:
    """Load the module's, optimizer's, scheduler's, precision's and callbacks' states."""
    module.load_state_dict(checkpoint["state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if lr_scheduler is not None and checkpoint["lr_scheduler"] is not None:
        lr_scheduler["scheduler"].load_state_dict(checkpoint["lr_scheduler"])
    precision.load_state_dict(checkpoint["precision"])
    states = checkpoint["callbacks"]
    for cb in callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])


def resume_point(checkpoint: dict[str, Any]) -> tuple[int, int, Resume | None]:
    """The epoch and batches done to continue from, and, in the middle of an epoch,
    the :class:`Resume` for :func:`epoch_batches`. At the start of an epoch the RNG
    states of the moment of saving are restored now."""
    rng = checkpoint["rng"]
    if checkpoint["epoch_finished"]:
        epoch, batches_done = checkpoint["epoch"] + 1, 0
    else:
        epoch, batches_done = checkpoint["epoch"], checkpoint["batches_done"]
    if batches_done == 0:
        restore_rng(rng["now"])
        return epoch, batches_done, None
    return epoch, batches_done, Resume(batches_done, rng["epoch_start"], rng["now"])


def epoch_batches(
    loader: Iterable[Any], resume: Resume | None
) -> tuple[Iterator[Any], int, dict[str, Any]]:
    """An epoch's batch iterator, the index of its first batch and the RNG states at
    its start: after a resume from the middle of an epoch, the batches already
    trained are drawn and skipped."""
    if resume is None:
        epoch_rng = capture_rng()
        return iter(loader), 0, epoch_rng
    restore_rng(resume.epoch_rng)
    batches = iter(loader)
    for _ in range(resume.batches_done):
        next(batches)
    restore_rng(resume.now_rng)
    return batches, resume.batches_done, resume.epoch_rng
