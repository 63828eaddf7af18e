"""Callbacks: code that runs at fixed points of a ``fit``/``validate``/``test``/``predict``.

Subclass :class:`Callback` and override the hooks you need; every hook is a
no-op by default and receives ``(trainer, module, ...)``. The trainer calls
hooks through :func:`dispatch` only, which runs them in the order of
``Trainer(callbacks=[...])``, then the module's hook of the same name (without
the ``trainer, module`` arguments), and adds the time each took to
``trainer.hook_seconds``.

The order of one ``fit`` with validation at the end of every epoch::

    setup(stage="fit")
    on_load_checkpoint(checkpoint)                  # only with fit(ckpt_path=...)
    on_fit_start
    on_train_start
      on_train_epoch_start                          # per epoch
        on_train_batch_start(batch, batch_idx)      # per batch
          on_before_backward(loss)                  # per micro-batch
          on_after_backward
          on_before_optimizer_step(optimizer)       # when the optimizer steps
        on_train_batch_end(outputs, batch, batch_idx)
        on_validation_start                         # when validation is due
          on_validation_epoch_start
            on_validation_batch_start(batch, batch_idx)
            on_validation_batch_end(outputs, batch, batch_idx)
          on_validation_epoch_end
        on_validation_end
      on_train_epoch_end
    on_train_end
    on_fit_end
    teardown(stage="fit")

``on_save_checkpoint(checkpoint)`` runs whenever a checkpoint is written and
``on_exception(exception)`` when the run fails. ``test`` and ``predict`` have the
same ``_start``/``_epoch_start``/``_batch_start``/... family as validation.

A callback whose :meth:`Callback.state_dict` is not empty is saved in every
checkpoint under its :attr:`Callback.state_key` and restored on resume.
"""

import contextlib
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from gpulayer.pytorch.module import Module
    from gpulayer.pytorch.trainer import Trainer


def dispatch(trainer: "Trainer", hook: str, *args: Any) -> None:
    """Call ``hook`` on every callback, then on the module; time each call.

    Only overridden hooks are called: the no-op defaults of :class:`Callback`
    and :class:`~gpulayer.pytorch.Module` are skipped, so a hook nobody
    implements costs one dictionary lookup per batch.

    Parameters
    ----------
    trainer
        The running trainer; its ``callbacks``, ``module`` and ``hook_seconds``
        are used.
    hook
        A hook name, e.g. ``"on_train_epoch_start"``.
    *args
        The hook's arguments after ``trainer, module``.
    """
    table = trainer.hook_table
    calls = table.get(hook)
    if calls is None:
        calls = table[hook] = _implementations(trainer, hook)
    if not calls:
        return
    seconds = trainer.hook_seconds
    module = trainer.module
    for key, method, with_trainer in calls:
        t0 = time.perf_counter()
        if with_trainer:
            method(trainer, module, *args)
        else:
            method(*args)
        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - t0


def _implementations(trainer: "Trainer", hook: str) -> list[tuple[str, Any, bool]]:
    """``(profile key, bound method, takes trainer and module)`` for each override of
    ``hook``, callbacks first, in order, then the module."""
    from gpulayer.pytorch.module import Module

    calls = []
    for callback in trainer.callbacks:
        if getattr(type(callback), hook) is not getattr(Callback, hook):
            calls.append((f"{type(callback).__name__}.{hook}", getattr(callback, hook), True))
    module = trainer.module
    # Looked up on the class: nn.Module's instance __getattr__ is slow for misses.
    method = getattr(type(module), hook, None)
    if method is not None and method is not getattr(Module, hook, None):
        calls.append((f"{type(module).__name__}.{hook}", getattr(module, hook), False))
    return calls


class Callback:
    """Base class: every hook is a no-op. See the module docstring for the order."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint (unique per trainer)."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (plain Python values and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def setup(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """Start of ``fit``/``validate``/``test``/``predict`` (``stage`` says which)."""

    def teardown(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """End of the stage, also after an exception."""

    def on_fit_start(self, trainer: "Trainer", module: "Module") -> None:
        """Fit begins (after any checkpoint was restored)."""

    def on_fit_end(self, trainer: "Trainer", module: "Module") -> None:
        """Fit ended normally."""

    def on_train_start(self, trainer: "Trainer", module: "Module") -> None:
        """Training begins."""

    def on_train_end(self, trainer: "Trainer", module: "Module") -> None:
        """Training ended."""

    def on_train_epoch_start(self, trainer: "Trainer", module: "Module") -> None:
        """A training epoch begins."""

    def on_train_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """A training epoch ended; its metrics (and the validation's) are in
        ``trainer.callback_metrics``."""

    def on_train_batch_start(
        self, trainer: "Trainer", module: "Module", batch: Any, batch_idx: int
    ) -> None:
        """Before ``training_step``."""

    def on_train_batch_end(
        self, trainer: "Trainer", module: "Module", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After ``training_step`` (and the optimizer step, if one was due)."""

    def on_before_backward(self, trainer: "Trainer", module: "Module", loss: torch.Tensor) -> None:
        """Before ``loss.backward()`` (``loss`` already divided for accumulation)."""

    def on_after_backward(self, trainer: "Trainer", module: "Module") -> None:
        """After the backward pass, before any optimizer step."""

    def on_before_optimizer_step(
        self, trainer: "Trainer", module: "Module", optimizer: torch.optim.Optimizer
    ) -> None:
        """Gradients are complete (and unscaled, and clipped): the optimizer steps next."""

    def on_validation_start(self, trainer: "Trainer", module: "Module") -> None:
        """Validation begins."""

    def on_validation_end(self, trainer: "Trainer", module: "Module") -> None:
        """Validation ended; its metrics are in ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self, trainer: "Trainer", module: "Module") -> None:
        """Before the first validation batch."""

    def on_validation_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """After the last validation batch; metrics logged here still count for the epoch
        (they are reduced right after, before ``on_validation_end``)."""

    def on_validation_batch_start(
        self, trainer: "Trainer", module: "Module", batch: Any, batch_idx: int
    ) -> None:
        """Before ``validation_step``."""

    def on_validation_batch_end(
        self, trainer: "Trainer", module: "Module", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After ``validation_step``."""

    def on_test_start(self, trainer: "Trainer", module: "Module") -> None:
        """Testing begins."""

    def on_test_end(self, trainer: "Trainer", module: "Module") -> None:
        """Testing ended."""

    def on_test_epoch_start(self, trainer: "Trainer", module: "Module") -> None:
        """Before the first test batch."""

    def on_test_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """After the last test batch; metrics logged here still count for the epoch
        (they are reduced right after, before ``on_test_end``)."""

    def on_test_batch_start(
        self, trainer: "Trainer", module: "Module", batch: Any, batch_idx: int
    ) -> None:
        """Before ``test_step``."""

    def on_test_batch_end(
        self, trainer: "Trainer", module: "Module", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After ``test_step``."""

    def on_predict_start(self, trainer: "Trainer", module: "Module") -> None:
        """Prediction begins."""

    def on_predict_end(self, trainer: "Trainer", module: "Module") -> None:
        """Prediction ended."""

    def on_predict_epoch_start(self, trainer: "Trainer", module: "Module") -> None:
        """Before the first predict batch."""

    def on_predict_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """After the last predict batch."""

    def on_predict_batch_start(
        self, trainer: "Trainer", module: "Module", batch: Any, batch_idx: int
    ) -> None:
        """Before ``predict_step``."""

    def on_predict_batch_end(
        self, trainer: "Trainer", module: "Module", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After ``predict_step``."""

    def on_save_checkpoint(
        self, trainer: "Trainer", module: "Module", checkpoint: dict[str, Any]
    ) -> None:
        """A checkpoint is about to be written; ``checkpoint`` may be extended."""

    def on_load_checkpoint(
        self, trainer: "Trainer", module: "Module", checkpoint: dict[str, Any]
    ) -> None:
        """A checkpoint was read and is about to be restored."""

    def on_exception(self, trainer: "Trainer", module: "Module", exception: BaseException) -> None:
        """The run raised ``exception`` (it is re-raised after the hooks)."""


Mode = Literal["min", "max"]


def _improves(value: float, best: float, mode: Mode, min_delta: float) -> bool:
    if math.isnan(value):
        return False
    return value < best - min_delta if mode == "min" else value > best + min_delta


def _monitored(trainer: "Trainer", monitor: str, who: str) -> float:
    try:
        return trainer.callback_metrics[monitor]
    except KeyError:
        known = ", ".join(sorted(trainer.callback_metrics)) or "none yet"
        raise KeyError(
            f"{who} monitors {monitor!r}, which was not logged (logged: {known})"
        ) from None


class EarlyStopping(Callback):
    """Stop fitting when a monitored metric has stopped improving.

    The metric is checked after each validation (or, when ``fit`` has no
    validation data, at the end of each training epoch). Every rank takes the
    same decision: it is all-reduced, so one rank stopping stops them all.

    Parameters
    ----------
    monitor
        A logged metric name, e.g. ``"val/loss"``.
    mode
        ``"min"`` if lower is better, ``"max"`` if higher is.
    patience
        How many checks without improvement to tolerate before stopping.
    min_delta
        The smallest change that counts as an improvement.
    stopping_threshold
        Stop as soon as the metric is at least this good.

    Examples
    --------
    >>> Trainer(max_epochs=100, callbacks=[EarlyStopping("val/loss", patience=3)])  # doctest: +SKIP
    """

    def __init__(
        self,
        monitor: str,
        mode: Mode = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        stopping_threshold: float | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta, self.stopping_threshold = abs(min_delta), stopping_threshold
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.stopped_epoch: int | None = None

    @property
    def state_key(self) -> str:
        """``EarlyStopping[monitor=...,mode=...]``."""
        return f"EarlyStopping[monitor={self.monitor},mode={self.mode}]"

    def state_dict(self) -> dict[str, Any]:
        """Best value, checks waited, and the epoch it stopped at."""
        return {"best": self.best, "wait": self.wait, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.best, self.wait = state["best"], state["wait"]
        self.stopped_epoch = state["stopped_epoch"]

    def on_validation_end(self, trainer: "Trainer", module: "Module") -> None:
        """Check after validation during ``fit``."""
        if trainer.stage == "fit":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """Check at epoch end when there is no validation."""
        if not trainer.has_validation:
            self._check(trainer)

    def _check(self, trainer: "Trainer") -> None:
        value = _monitored(trainer, self.monitor, "EarlyStopping")
        if _improves(value, self.best, self.mode, self.min_delta):
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        stop = self.wait >= self.patience
        if self.stopping_threshold is not None:
            stop = stop or not _improves(self.stopping_threshold, value, self.mode, 0.0)
        assert trainer.runtime is not None  # fit sets it before any callback runs
        if trainer.runtime.any(stop):
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch


class ModelCheckpoint(Callback):
    """Save checkpoints during ``fit``: the ``save_top_k`` best by ``monitor``, and a last.

    Files are written by the main rank only, into ``dirpath``: by default
    ``checkpoints/`` under ``$GPULAYER_ARTIFACTS`` when that is set (so on a
    gpulayer worker they become the job's artifacts), else under the trainer's
    ``default_root_dir``. A checkpoint is written after each validation that
    runs within an epoch, and at the end of every epoch.

    Parameters
    ----------
    dirpath
        Where to write; see above for the default.
    filename
        A :meth:`str.format` template with ``epoch``, ``step`` and the logged
        metrics (``"{epoch}-{val/loss:.3f}"``); ``/`` in a name becomes ``_``.
    monitor
        The metric that ranks checkpoints; ``None`` keeps the most recent ones.
    mode
        ``"min"`` if lower is better, ``"max"`` if higher is.
    save_top_k
        How many ranked checkpoints to keep; ``-1`` keeps all, ``0`` none.
    save_last
        Also write ``last.ckpt`` every time (resume from it with
        ``fit(ckpt_path=...)``).
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str = "epoch={epoch}-step={step}",
        monitor: str | None = None,
        mode: Mode = "min",
        save_top_k: int = 1,
        save_last: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.filename, self.monitor, self.mode = filename, monitor, mode
        self.save_top_k, self.save_last = save_top_k, save_last
        #: ``[(score, path), ...]`` of the kept checkpoints, best first.
        self.best_k: list[tuple[float, str]] = []
        self.last_path: str | None = None

    @property
    def state_key(self) -> str:
        """``ModelCheckpoint[monitor=...,mode=...]``."""
        return f"ModelCheckpoint[monitor={self.monitor},mode={self.mode}]"

    @property
    def best_model_path(self) -> str | None:
        """The best kept checkpoint, or ``None`` before the first."""
        return self.best_k[0][1] if self.best_k else None

    def state_dict(self) -> dict[str, Any]:
        """The kept checkpoints and their scores."""
        return {"best_k": [list(item) for item in self.best_k], "last_path": self.last_path}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.best_k = [(float(s), str(p)) for s, p in state["best_k"]]
        self.last_path = state["last_path"]

    def setup(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """Resolve the directory."""
        if self.dirpath is None:
            self.dirpath = trainer.artifacts_dir / "checkpoints"

    def on_validation_end(self, trainer: "Trainer", module: "Module") -> None:
        """Save after a validation inside an epoch (the epoch end saves anyway)."""
        if trainer.stage == "fit" and not trainer.epoch_finished:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """Save at the end of every epoch."""
        self._save(trainer)

    def _save(self, trainer: "Trainer") -> None:
        assert self.dirpath is not None
        if self.monitor is None:
            score = float(trainer.global_step)
        elif self.monitor in trainer.callback_metrics or trainer.validated:
            score = _monitored(trainer, self.monitor, "ModelCheckpoint")
        else:
            score = math.nan  # no validation yet (say max_steps came first): only "last"
        if self.save_top_k != 0 and not math.isnan(score):
            kept = len(self.best_k) < self.save_top_k or self.save_top_k < 0
            if kept or self._rank(score) < max(self._rank(s) for s, _ in self.best_k):
                path = str(self.dirpath / (self._name(trainer) + ".ckpt"))
                trainer.save_checkpoint(path)
                self.best_k = [(s, p) for s, p in self.best_k if p != path] + [(score, path)]
                self._prune(trainer)
        if self.save_last:
            self.last_path = str(self.dirpath / "last.ckpt")
            trainer.save_checkpoint(self.last_path)

    def _rank(self, score: float) -> float:
        """Lower is better: the score itself for ``min``, else its negation (without a
        monitor the score is the step, and newer is better)."""
        return score if self.monitor is not None and self.mode == "min" else -score

    def _prune(self, trainer: "Trainer") -> None:
        self.best_k.sort(key=lambda item: self._rank(item[0]))
        if self.save_top_k < 0:
            return
        dropped, self.best_k = self.best_k[self.save_top_k :], self.best_k[: self.save_top_k]
        assert trainer.runtime is not None  # fit sets it before any callback runs
        if trainer.runtime.is_main:
            for _, path in dropped:
                _unlink(path)

    def _name(self, trainer: "Trainer") -> str:
        fields: dict[str, float] = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        fields.update(trainer.callback_metrics)
        return self.filename.format(**fields).replace("/", "_").replace(os.sep, "_")


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
