"""Evaluation: the validation, test and predict loop, and when ``fit`` validates.

A pass runs the module in eval mode without gradients, under the precision's
autocast, with the ``on_<kind>_*`` hooks (``kind`` is ``"validation"``,
``"test"`` or ``"predict"``). ``Trainer(val_check_interval=...)`` says where in
an epoch ``fit`` validates: a float is a fraction of the epoch, an int a count of
training batches.
"""

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from gpulayer.pytorch.batches import length, move_to_device
from gpulayer.pytorch.precision import Precision


def check_interval(value: float | int) -> None:
    """Reject a ``val_check_interval`` that is neither a fraction in (0, 1] nor a
    positive batch count.

    Raises
    ------
    TypeError, ValueError
        For a value of the wrong type, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("val_check_interval must be a float fraction or an int batch count")
    if isinstance(value, float) and not (0.0 < value <= 1.0 and math.isfinite(value)):
        raise ValueError("a float val_check_interval must be in (0, 1]")
    if isinstance(value, int) and value < 1:
        raise ValueError("an int val_check_interval must be at least 1")


def validation_every(interval: float | int, loader: Iterable[Any]) -> int | None:
    """Validate every this many training batches of ``loader`` (``None``: at the
    epoch's end).

    Raises
    ------
    ValueError
        For a fractional ``interval`` and a loader without a ``len()``.
    """
    if isinstance(interval, int) and not isinstance(interval, bool):
        return interval
    if interval == 1.0:
        return None
    n = length(loader)
    if n is None:
        raise ValueError("a fractional val_check_interval needs a train loader with a len()")
    return max(1, int(n * interval))


def run_loop(
    kind: str,
    step: Callable[[Any, int], Any],
    loader: Iterable[Any],
    *,
    module: nn.Module,
    device: torch.device,
    precision: Precision,
    hook: Callable[..., None],
    keep: bool,
) -> list[Any]:
    """One pass over ``loader`` in eval mode without gradients, with the
    ``on_<kind>_*`` hooks (``hook(name, *args)``); ``on_<kind>_end`` is left to the
    caller except for predict. Answers the step outputs when ``keep``, else ``[]``."""
    module.eval()
    results = []
    hook(f"on_{kind}_start")
    hook(f"on_{kind}_epoch_start")
    with torch.no_grad():
        for batch_idx, batch in enumerate(loader):
            hook(f"on_{kind}_batch_start", batch, batch_idx)
            batch = move_to_device(batch, device)
            with precision.autocast():
                outputs = step(batch, batch_idx)
            if keep:
                results.append(outputs)
            hook(f"on_{kind}_batch_end", outputs, batch, batch_idx)
    hook(f"on_{kind}_epoch_end")
    if kind == "predict":
        hook("on_predict_end")
    return results
