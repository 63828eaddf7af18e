"""Numeric precision of the forward and backward passes.

``"32"``
    plain float32: no autocast, no scaling.
``"bf16-mixed"``
    ops run under ``torch.autocast(dtype=torch.bfloat16)`` (CUDA, CPU and MPS);
    parameters, gradients and optimizer state stay float32. bfloat16 has
    float32's range, so no loss scaling is needed.
``"16-mixed"``
    ``torch.autocast(dtype=torch.float16)`` with a :class:`torch.amp.GradScaler`
    that scales the loss so small gradients survive float16, unscales before
    clipping and skips steps whose gradients overflowed.
"""

import contextlib
from typing import Any, Literal

import torch

#: Reusable: entering a nullcontext has no state.
_NO_AUTOCAST = contextlib.nullcontext()

PrecisionName = Literal["32", "bf16-mixed", "16-mixed"]

_ALIASES = {
    "32": "32", "32-true": "32", 32: "32",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "16-mixed": "16-mixed", "16": "16-mixed", 16: "16-mixed",
}  # fmt: skip


def parse_precision(value: str | int) -> PrecisionName:
    """Normalize ``value`` (``32``, ``"32-true"``, ``"bf16"``, ``"16"``...) to a name.

    Raises
    ------
    ValueError
        For anything else.
    """
    try:
        return _ALIASES[value]  # type: ignore[return-value]
    except KeyError:
        raise ValueError(
            f"precision must be '32', 'bf16-mixed' or '16-mixed', not {value!r}"
        ) from None


class Precision:
    """Autocast, loss scaling and the optimizer step for one precision on one device.

    Parameters
    ----------
    name
        See the module docstring.
    device
        The training device; autocast and the scaler are made for its type.
    """

    def __init__(self, name: str | int, device: torch.device) -> None:
        self.name = parse_precision(name)
        self.device = device
        dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(self.name)
        self.dtype = dtype
        self.scaler = torch.amp.GradScaler(device.type) if self.name == "16-mixed" else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the forward pass (and the step functions) run in."""
        if self.dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under ``16-mixed``."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true size (before clipping or inspecting them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer (skipped by the scaler when gradients overflowed)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (empty without one)."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
