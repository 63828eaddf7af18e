"""gpulayer's PyTorch training library: Module, Trainer, callbacks, Runtime, launch.

>>> from gpulayer.pytorch import Module, Trainer, EarlyStopping, ModelCheckpoint
>>> trainer = Trainer(max_epochs=10, callbacks=[EarlyStopping("val/loss")])
>>> trainer.fit(model, train_loader, val_loader)  # doctest: +SKIP

The same script runs in a notebook, under ``torchrun`` (one process per GPU,
DDP) and on a gpulayer worker, where checkpoints land in the job's artifacts
and metrics go to ``$GPULAYER_METRICS_FILE``. This is the only part of gpulayer
that imports torch; see ``docs/pytorch.md``.
"""

from gpulayer.pytorch.batches import move_to_device
from gpulayer.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint, dispatch
from gpulayer.pytorch.launch import LaunchError, launch
from gpulayer.pytorch.metrics import (
    METRICS_FILE_ENV,
    HistorySink,
    JsonlSink,
    MetricRecord,
    MetricSink,
)
from gpulayer.pytorch.module import Module
from gpulayer.pytorch.progress import ProgressBar
from gpulayer.pytorch.runtime import Runtime, select_device
from gpulayer.pytorch.trainer import ARTIFACTS_ENV, Trainer

__all__ = [
    "ARTIFACTS_ENV",
    "METRICS_FILE_ENV",
    "Callback",
    "EarlyStopping",
    "HistorySink",
    "JsonlSink",
    "LaunchError",
    "MetricRecord",
    "MetricSink",
    "ModelCheckpoint",
    "Module",
    "ProgressBar",
    "Runtime",
    "Trainer",
    "dispatch",
    "launch",
    "move_to_device",
    "select_device",
]
