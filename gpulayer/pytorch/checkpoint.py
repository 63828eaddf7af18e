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
from pathlib import Path
from typing import Any

import torch

FORMAT = 1


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
