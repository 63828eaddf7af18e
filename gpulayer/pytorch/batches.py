"""Batches: moving them to the device, and knowing which one ends the epoch."""

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch


def move_to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (through tuples, lists and dicts) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, tuple):
        items = [move_to_device(b, device) for b in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else tuple(items)
    if isinstance(batch, list):
        return [move_to_device(b, device) for b in batch]
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    return batch


def lookahead(batches: Iterator[Any], start: int) -> Iterator[tuple[int, Any, bool]]:
    """``(index, batch, is_last)``, reading one batch ahead to know which is last."""
    try:
        current = next(batches)
    except StopIteration:
        return
    index = start
    for following in batches:
        yield index, current, False
        current, index = following, index + 1
    yield index, current, True


def due(every: int | None, batch_idx: int, is_last: bool) -> bool:
    """Whether something done every ``every`` batches (``None``: at the epoch's end)
    is due after batch ``batch_idx``."""
    return is_last if every is None else (batch_idx + 1) % every == 0


def length(loader: Iterable[Any]) -> int | None:
    """``len(loader)``, or ``None`` for an iterable without one."""
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None
