"""One optimizer step of the :class:`~gpulayer.pytorch.Trainer`.

With ``accumulate_grad_batches = A``::

    for each of A micro-batches (the last A-1 ... under DDP no_sync, except the last):
        with autocast:  loss = training_step(batch) / A
        backward(loss)                      # scaled under 16-mixed
    unscale → clip → on_before_optimizer_step → optimizer.step → zero_grad → scheduler

The trainer counts the micro-batches and owns the loop; this module holds the
steps themselves. ``hook`` is the trainer's hook dispatch (``hook(name, *args)``,
see :func:`~gpulayer.pytorch.dispatch`).
"""

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpulayer.pytorch.precision import Precision
from gpulayer.pytorch.runtime import Runtime

#: Calls a hook by name on the callbacks and the module: ``hook(name, *args)``.
Hook = Callable[..., None]
#: A training step: ``step(batch, batch_idx)`` answers a loss or ``{"loss": ...}``.
StepFunction = Callable[[Any, int], Any]

_NO_SYNC = contextlib.nullcontext()


class _TrainingStep(nn.Module):
    """Lets DDP's forward run ``training_step``, so its gradient hooks see the step."""

    def __init__(self, module: nn.Module, training_step: StepFunction) -> None:
        super().__init__()
        self.module = module
        self.training_step = training_step

    def forward(self, batch: Any, batch_idx: int) -> Any:
        return self.training_step(batch, batch_idx)


def data_parallel(
    module: nn.Module,
    training_step: StepFunction,
    runtime: Runtime,
    find_unused_parameters: bool,
) -> DistributedDataParallel | None:
    """``module`` wrapped in ``DistributedDataParallel`` so that calling the wrapper runs
    ``training_step``; ``None`` outside a distributed run."""
    if not runtime.is_distributed:
        return None
    device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    return DistributedDataParallel(
        _TrainingStep(module, training_step),
        device_ids=device_ids,
        find_unused_parameters=find_unused_parameters,
    )


def forward_backward(
    step: StepFunction,
    batch: Any,
    batch_idx: int,
    *,
    precision: Precision,
    accumulate_grad_batches: int,
    no_sync: DistributedDataParallel | None,
    hook: Hook,
) -> Any:
    """Run one micro-batch's ``step`` under autocast and its loss's backward (divided
    by ``accumulate_grad_batches``); answers the step's outputs.

    ``no_sync``: the DDP wrapper when this micro-batch does not step, so its gradients
    are not all-reduced yet (they are only on the micro-batch that steps).
    """
    sync = _NO_SYNC if no_sync is None else no_sync.no_sync()
    with sync:
        with precision.autocast():
            outputs = step(batch, batch_idx)
        loss = outputs["loss"] if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            if accumulate_grad_batches > 1:
                loss = loss / accumulate_grad_batches
            hook("on_before_backward", loss)
            precision.backward(loss)
            hook("on_after_backward")
    return outputs


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    parameters: Iterable[torch.Tensor],
    gradient_clip_val: float | None,
    hook: Hook,
) -> None:
    """Unscale, clip ``parameters``' gradients to ``gradient_clip_val`` (total L2 norm),
    ``on_before_optimizer_step``, step the optimizer and zero the gradients."""
    precision.unscale(optimizer)
    if gradient_clip_val is not None:
        nn.utils.clip_grad_norm_(parameters, gradient_clip_val)
    hook("on_before_optimizer_step", optimizer)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)


def scheduler_due(sched: dict[str, Any] | None, interval: str, count: int) -> bool:
    """Whether the scheduler config ``sched`` (see ``parse_optimizers``) steps after the
    ``count``-th ``interval`` (``"step"``: optimizer steps, ``"epoch"``: epochs)."""
    return sched is not None and sched["interval"] == interval and count % sched["frequency"] == 0


def scheduler_step(sched: dict[str, Any], metrics: Mapping[str, float]) -> None:
    """Step the scheduler; one with a ``monitor`` gets that metric, and waits while
    ``metrics`` lacks it."""
    if sched["monitor"] is None:
        sched["scheduler"].step()
    elif sched["monitor"] in metrics:
        sched["scheduler"].step(metrics[sched["monitor"]])
