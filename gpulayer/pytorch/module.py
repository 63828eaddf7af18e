"""The :class:`Module`: a ``torch.nn.Module`` that also says how to train itself."""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from gpulayer.pytorch.metrics import Number

if TYPE_CHECKING:
    from gpulayer.pytorch.trainer import Trainer

#: What ``configure_optimizers`` may return: an optimizer; ``(optimizer, scheduler)``;
#: or ``{"optimizer": opt, "lr_scheduler": sched | {"scheduler": sched, "interval":
#: "epoch" | "step", "frequency": 1, "monitor": "val/loss"}}``.
OptimizerConfig = torch.optim.Optimizer | tuple[torch.optim.Optimizer, Any] | Mapping[str, Any]

#: A scheduler with when to step it: ``{"scheduler", "interval", "frequency", "monitor"}``.
SchedulerConfig = dict[str, Any]


class Module(nn.Module):
    """A model with its training logic, run by :class:`~gpulayer.pytorch.Trainer`.

    Override :meth:`training_step` and :meth:`configure_optimizers`; the other
    steps are optional. The trainer moves batches to :attr:`device`, switches
    between ``train()`` and ``eval()``, and runs evaluation under
    ``torch.no_grad()``. Any hook name of :class:`~gpulayer.pytorch.Callback`
    may be defined here too, without the ``trainer, module`` arguments
    (``def on_train_epoch_end(self): ...``).

    Examples
    --------
    >>> class Regression(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.net = torch.nn.Linear(3, 1)
    ...     def training_step(self, batch, batch_idx):
    ...         x, y = batch
    ...         loss = torch.nn.functional.mse_loss(self.net(x), y)
    ...         self.log("train/loss", loss, prog_bar=True)
    ...         return loss
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    """

    _gl_trainer: "Trainer | None"

    def __init__(self) -> None:
        super().__init__()
        # Kept out of nn.Module's registries: the trainer is not a submodule.
        object.__setattr__(self, "_gl_trainer", None)

    @property
    def trainer(self) -> "Trainer":
        """The trainer running this module.

        Raises
        ------
        RuntimeError
            Outside ``fit``/``validate``/``test``/``predict``.
        """
        trainer = self._gl_trainer
        if trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer")
        return trainer

    @property
    def device(self) -> torch.device:
        """Where the module's parameters are (the CPU when it has none)."""
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | Mapping[str, Any]:
        """Compute the loss of one batch: return it, or a mapping with a ``"loss"`` key.

        With gradient accumulation, return the batch's *mean* loss: the trainer
        divides it by ``accumulate_grad_batches`` before the backward pass.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement training_step")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one validation batch; :meth:`log` what matters (averaged per epoch)."""
        raise NotImplementedError(f"{type(self).__name__} has no validation_step")

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one test batch; :meth:`log` what matters (averaged per epoch)."""
        raise NotImplementedError(f"{type(self).__name__} has no test_step")

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """The prediction for one batch; by default ``self(batch)``."""
        return self(batch)

    def configure_optimizers(self) -> OptimizerConfig:
        """The optimizer, and optionally a learning-rate scheduler (see ``OptimizerConfig``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers")

    def log(
        self,
        name: str,
        value: Number,
        *,
        prog_bar: bool = False,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce: Literal["mean", "sum", "max", "min"] = "mean",
        batch_size: int | None = None,
    ) -> None:
        """Log a scalar metric.

        Logging is cheap: the value stays on the device (detached) until a log
        point (every ``log_every_n_steps`` steps, and each epoch end), where the
        trainer reduces it over ranks and reads it once.

        Parameters
        ----------
        name
            ``"<group>/<name>"`` by convention, e.g. ``"train/loss"``.
        value
            A one-element tensor or a number.
        prog_bar
            Show it on the progress bar.
        on_step, on_epoch
            Report the per-step value and/or the epoch aggregate. Defaults: per
            step in training, per epoch in validation and test. With both, the
            names get ``_step`` and ``_epoch`` suffixes.
        reduce
            How values within an epoch (and over ranks) combine.
        batch_size
            Weight of this value in the epoch mean (default 1 per call).

        Notes
        -----
        Under DDP every rank must log the same names at the same points: the
        values are all-reduced.
        """
        trainer = self.trainer
        training = trainer.stage == "fit" and not trainer.evaluating
        trainer.active_metrics.log(
            name,
            value,
            on_step=training if on_step is None else on_step,
            on_epoch=(not training) if on_epoch is None else on_epoch,
            prog_bar=prog_bar,
            reduce=reduce,
            weight=1.0 if batch_size is None else float(batch_size),
        )

    def log_dict(self, metrics: Mapping[str, Number], **options: Any) -> None:
        """:meth:`log` every item of ``metrics`` with the same options."""
        for name, value in metrics.items():
            self.log(name, value, **options)

    # Module-side hooks, called after the callbacks' (see gpulayer.pytorch.callbacks).
    # Defined here so that dispatch finds them through the class, not nn.Module's
    # slower __getattr__ fallback.
    def setup(self, stage: str) -> None:
        """Start of a stage (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``)."""

    def teardown(self, stage: str) -> None:
        """End of a stage."""

    def on_fit_start(self) -> None:
        """Fit begins."""

    def on_fit_end(self) -> None:
        """Fit ended."""

    def on_train_epoch_start(self) -> None:
        """A training epoch begins."""

    def on_train_epoch_end(self) -> None:
        """A training epoch ended."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Before ``training_step``."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After ``training_step``."""

    def on_validation_epoch_end(self) -> None:
        """After the last validation batch."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add entries to a checkpoint about to be written."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read entries back from a checkpoint about to be restored."""


def parse_optimizers(
    config: OptimizerConfig,
) -> tuple[torch.optim.Optimizer, dict[str, Any] | None]:
    """Split what ``configure_optimizers`` returned into the optimizer and a scheduler
    config ``{"scheduler", "interval", "frequency", "monitor"}`` (or ``None``).

    Raises
    ------
    TypeError, ValueError
        If ``config`` has none of the accepted shapes, or a bad interval.
    """
    scheduler: Any = None
    if isinstance(config, torch.optim.Optimizer):
        optimizer = config
    elif isinstance(config, tuple | list) and len(config) == 2:
        optimizer, scheduler = config
    elif isinstance(config, Mapping) and "optimizer" in config:
        optimizer, scheduler = config["optimizer"], config.get("lr_scheduler")
    else:
        raise TypeError(
            "configure_optimizers must return an optimizer, (optimizer, scheduler) or "
            f"{{'optimizer': ..., 'lr_scheduler': ...}}, not {type(config).__name__}"
        )
    if scheduler is None:
        return optimizer, None
    if not isinstance(scheduler, Mapping):
        scheduler = {"scheduler": scheduler}
    scheduler = {"interval": "epoch", "frequency": 1, "monitor": None, **scheduler}
    if scheduler["interval"] not in ("epoch", "step"):
        raise ValueError("a scheduler's interval must be 'epoch' or 'step'")
    return optimizer, scheduler
