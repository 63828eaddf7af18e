"""The :class:`Trainer`: runs a :class:`~gpulayer.pytorch.Module`'s steps.

One optimizer step spans ``accumulate_grad_batches`` micro-batches
(:mod:`gpulayer.pytorch.optimization`); validation, test and predict passes are
:mod:`gpulayer.pytorch.evaluation`'s loop; checkpoints and resuming are
:mod:`gpulayer.pytorch.checkpoint`'s.

The hot loop never waits for the device: logged values stay device tensors until
a log point (every ``log_every_n_steps`` optimizer steps, and each epoch end),
where they are reduced over ranks, read once and handed to the metric sinks
(:mod:`gpulayer.pytorch.metrics`).

At the end of an epoch the order is: training batches, validation (when due),
epoch metrics, epoch-interval scheduler step, ``on_train_epoch_end`` (where
:class:`~gpulayer.pytorch.ModelCheckpoint` saves): a checkpoint written there
holds the scheduler already stepped, so resuming continues exactly.
"""

import contextlib
import gc
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from gpulayer.pytorch import checkpoint as ckpt
from gpulayer.pytorch import evaluation, optimization
from gpulayer.pytorch.batches import due, length, lookahead, move_to_device
from gpulayer.pytorch.callbacks import Callback, dispatch
from gpulayer.pytorch.metrics import (
    HistorySink,
    JsonlSink,
    MetricCollector,
    MetricRecord,
    MetricSink,
)
from gpulayer.pytorch.module import Module, parse_optimizers
from gpulayer.pytorch.optimization import scheduler_due, scheduler_step
from gpulayer.pytorch.precision import Precision, parse_precision
from gpulayer.pytorch.progress import ProgressBar
from gpulayer.pytorch.runtime import Runtime

#: The variable that, when set, is where checkpoints and other run files go.
ARTIFACTS_ENV = "GPULAYER_ARTIFACTS"


class Trainer:
    """Fit, validate, test and predict with a :class:`~gpulayer.pytorch.Module`.

    Parameters
    ----------
    max_epochs
        Stop after this many epochs.
    max_steps
        Stop after this many optimizer steps (``-1``: no limit). At least one of
        ``max_epochs`` and ``max_steps`` must be set.
    accumulate_grad_batches
        Micro-batches per optimizer step; each loss is divided by it.
    precision
        ``"32"``, ``"bf16-mixed"`` or ``"16-mixed"`` (see :mod:`gpulayer.pytorch.precision`).
    gradient_clip_val
        Clip the gradients' total L2 norm to this value before each step.
    callbacks
        :class:`~gpulayer.pytorch.Callback` instances, called in this order.
    devices
        ``"auto"`` (CUDA, then MPS, then CPU), ``"cpu"``, ``"cuda"``, ``"mps"``
        or ``"cuda:N"``. Several processes come from ``torchrun`` or
        :func:`~gpulayer.pytorch.launch`, not from this argument.
    val_check_interval
        A float: validate after that fraction of each epoch (``1.0``: at the end);
        an int: every that many training batches.
    check_val_every_n_epoch
        Validate only in every n-th epoch.
    log_every_n_steps
        How often (in optimizer steps) per-step metrics are read and reported.
    default_root_dir
        Where checkpoints go when ``$GPULAYER_ARTIFACTS`` is unset (default: the cwd).
    enable_progress_bar
        Add a :class:`~gpulayer.pytorch.ProgressBar` unless one is in ``callbacks``.
    metric_sinks
        Extra :class:`~gpulayer.pytorch.MetricSink` objects; the history, and a
        :class:`~gpulayer.pytorch.JsonlSink` when ``$GPULAYER_METRICS_FILE`` is set
        (main rank), are always there.
    find_unused_parameters
        Passed to ``DistributedDataParallel``.
    log_rank_metrics
        In a distributed run, every rank also writes its own (unreduced) values at
        each log point to ``$GPULAYER_METRICS_FILE``, as records with its ``rank``;
        the reduced record then carries ``rank=None``. The job widget's "per rank"
        box draws them. Costs one more host copy per log point; off by default.

    Attributes
    ----------
    current_epoch, global_step : int
        The epoch being trained and the optimizer steps taken.
    callback_metrics : dict[str, float]
        The latest value of every reported metric.
    logged_metrics : dict[str, float]
        What the last log point reported.
    history : list[tuple[int, dict[str, float]]]
        Every log point as ``(global_step, metrics)``.
    should_stop : bool
        Set it (from a callback) to end ``fit`` after the current batch.
    """

    def __init__(
        self,
        *,
        max_epochs: int | None = None,
        max_steps: int = -1,
        accumulate_grad_batches: int = 1,
        precision: str | int = "32",
        gradient_clip_val: float | None = None,
        callbacks: Iterable[Callback] = (),
        devices: str | torch.device = "auto",
        val_check_interval: float | int = 1.0,
        check_val_every_n_epoch: int = 1,
        log_every_n_steps: int = 50,
        default_root_dir: str | Path | None = None,
        enable_progress_bar: bool = True,
        metric_sinks: Iterable[MetricSink] = (),
        find_unused_parameters: bool = False,
        log_rank_metrics: bool = False,
    ) -> None:
        if max_epochs is None and max_steps < 0:
            raise ValueError("set max_epochs or max_steps (or both)")
        if accumulate_grad_batches < 1:
            raise ValueError("accumulate_grad_batches must be at least 1")
        if log_every_n_steps < 1 or check_val_every_n_epoch < 1:
            raise ValueError("log_every_n_steps and check_val_every_n_epoch must be at least 1")
        evaluation.check_interval(val_check_interval)
        self.max_epochs, self.max_steps = max_epochs, max_steps
        self.accumulate_grad_batches = accumulate_grad_batches
        self.precision = parse_precision(precision)
        self.gradient_clip_val = gradient_clip_val
        self.devices = devices
        self.val_check_interval = val_check_interval
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.log_every_n_steps = log_every_n_steps
        self.default_root_dir = Path(default_root_dir or os.getcwd())
        self.find_unused_parameters = find_unused_parameters
        self.log_rank_metrics = log_rank_metrics
        self.callbacks: list[Callback] = list(callbacks)
        if enable_progress_bar and not any(isinstance(cb, ProgressBar) for cb in self.callbacks):
            self.callbacks.append(ProgressBar())
        ckpt.check_state_keys(self.callbacks)
        self._extra_sinks = list(metric_sinks)
        self._history = HistorySink()

        self.runtime: Runtime | None = None
        self.module: Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: dict[str, Any] | None = None
        self.stage: str | None = None
        self.evaluating = False
        self.has_validation = False
        #: Whether a validation has run in the current ``fit``.
        self.validated = False
        self.current_epoch = 0
        self.global_step = 0
        self.batch_idx = 0
        self.batches_done = 0
        self.epoch_finished = False
        self.should_stop = False
        self.num_training_batches: int | None = None
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}
        self.progress_bar_metrics: dict[str, float] = {}
        #: Seconds spent in each hook, by ``"<Class>.<hook>"`` (see ``dispatch``).
        self.hook_seconds: dict[str, float] = {}
        #: The overridden hooks, filled by ``dispatch``; cleared when a stage starts.
        self.hook_table: dict[str, list[tuple[str, Any, bool]]] = {}
        self._collectors = {k: MetricCollector() for k in ("train", "validation", "test")}
        self.active_metrics = self._collectors["train"]
        self._sinks: list[MetricSink] = []
        self._rank_sink: JsonlSink | None = None  # log_rank_metrics: this rank's records
        self._precision: Precision | None = None
        self._ddp: DistributedDataParallel | None = None
        self._micro = 0
        self._epoch_rng: dict[str, Any] | None = None
        self._resume: ckpt.Resume | None = None

    # ------------------------------------------------------------------ public API

    @property
    def artifacts_dir(self) -> Path:
        """``$GPULAYER_ARTIFACTS`` when set (a gpulayer job's artifact folder), else
        ``default_root_dir``."""
        env = os.environ.get(ARTIFACTS_ENV)
        return Path(env) if env else self.default_root_dir

    @property
    def history(self) -> list[tuple[int, dict[str, float]]]:
        """Every log point so far as ``(global_step, metrics)``."""
        return [(r.step, r.metrics) for r in self._history.records]

    def fit(
        self,
        module: Module,
        train_dataloader: Iterable[Any],
        val_dataloader: Iterable[Any] | None = None,
        ckpt_path: str | Path | None = None,
    ) -> "Trainer":
        """Train ``module`` until ``max_epochs``/``max_steps`` or a callback stops it.

        Parameters
        ----------
        module
            The model and its steps.
        train_dataloader, val_dataloader
            Iterables of batches (usually ``torch.utils.data.DataLoader``).
            Under DDP, give each rank its shard (a ``DistributedSampler``).
        ckpt_path
            Resume from this checkpoint: parameters, optimizer, scheduler, loop
            position, random state and callback state.

        Returns
        -------
        Trainer
            ``self``, so ``Trainer(...).fit(...).callback_metrics`` reads well.
        """
        self._attach(module)
        self.has_validation, self.validated = val_dataloader is not None, False
        try:
            with self._running("fit"):
                self.optimizer, self.lr_scheduler = parse_optimizers(module.configure_optimizers())
                if ckpt_path is not None:
                    self._restore(ckpt.load(ckpt_path))
                self._wrap(module)
                dispatch(self, "on_fit_start")
                dispatch(self, "on_train_start")
                while not self._done():
                    self._train_epoch(train_dataloader, val_dataloader)
                dispatch(self, "on_train_end")
                dispatch(self, "on_fit_end")
        finally:
            self._unwrap()
        return self

    def validate(
        self, module: Module, dataloader: Iterable[Any], ckpt_path: str | Path | None = None
    ) -> dict[str, float]:
        """Run ``validation_step`` over ``dataloader``; return the epoch metrics.

        Returns
        -------
        dict[str, float]
            Each logged name with its epoch value, e.g. ``{"val/loss": 0.12}``.
        """
        return self._evaluate_stage("validate", "validation", module, dataloader, ckpt_path)

    def test(
        self, module: Module, dataloader: Iterable[Any], ckpt_path: str | Path | None = None
    ) -> dict[str, float]:
        """Run ``test_step`` over ``dataloader``; return the epoch metrics (as :meth:`validate`)."""
        return self._evaluate_stage("test", "test", module, dataloader, ckpt_path)

    def predict(
        self, module: Module, dataloader: Iterable[Any], ckpt_path: str | Path | None = None
    ) -> list[Any]:
        """Run ``predict_step`` over ``dataloader`` without gradients.

        Returns
        -------
        list
            One ``predict_step`` result per batch, in order (this rank's batches
            only, under DDP).
        """
        self._attach(module)
        with self._running("predict"):
            if ckpt_path is not None:
                module.load_state_dict(ckpt.load(ckpt_path)["state_dict"])
            return self._loop("predict", module.predict_step, dataloader, keep=True)

    def save_checkpoint(self, path: str | Path) -> None:
        """Write a checkpoint of the running fit to ``path`` (main rank only).

        Every rank must call it: callbacks' ``on_save_checkpoint`` runs everywhere.
        """
        checkpoint = self._checkpoint()
        assert self.runtime is not None
        if self.runtime.is_main:
            ckpt.save(checkpoint, path)

    # ------------------------------------------------------------------ setup

    def _attach(self, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"expected a gpulayer.pytorch.Module, got {type(module).__name__}")
        if self.runtime is None:
            self.runtime = Runtime.from_env(self.devices)
            self.runtime.init()
        module.to(self.runtime.device)
        object.__setattr__(module, "_gl_trainer", self)
        self.module = module
        self._precision = Precision(self.precision, self.runtime.device)

    @contextlib.contextmanager
    def _running(self, stage: str) -> Iterator[None]:
        assert self.runtime is not None
        self.stage = stage
        self.hook_table.clear()  # callbacks may have been added since the last stage
        self._sinks = [self._history, *self._extra_sinks]
        jsonl = JsonlSink.from_env() if self.runtime.is_main else None
        if jsonl is not None:
            self._sinks.append(jsonl)
        self._rank_sink = None
        if self.log_rank_metrics and self.runtime.is_distributed:
            self._rank_sink = jsonl or JsonlSink.from_env()
        dispatch(self, "setup", stage)
        try:
            yield
        except BaseException as e:
            dispatch(self, "on_exception", e)
            raise
        finally:
            dispatch(self, "teardown", stage)
            for sink in self._sinks:
                sink.close()
            if self._rank_sink is not None:
                self._rank_sink.close()  # a no-op when it is the main rank's file
            self.stage = None

    def _wrap(self, module: Module) -> None:
        assert self.runtime is not None
        self._ddp = optimization.data_parallel(
            module, module.training_step, self.runtime, self.find_unused_parameters
        )

    def _unwrap(self) -> None:
        """Let go of the DDP wrapper (and with it the process group its reducer holds).

        Kept, it would live as long as the trainer (which the module points back to,
        a cycle), so ``destroy_process_group`` could not free the group: gloo's threads
        would then be torn down during interpreter shutdown, which can abort the process
        ("terminate called without an active exception") after training succeeded.
        """
        if self._ddp is not None:
            self._ddp = None
            gc.collect()  # the wrapper's own cycles go now, not at interpreter exit

    def _hook(self, hook: str, *args: Any) -> None:
        """:func:`~gpulayer.pytorch.dispatch` for this trainer, for the step functions."""
        dispatch(self, hook, *args)

    # ------------------------------------------------------------------ fit loop

    def _done(self) -> bool:
        if self.should_stop or self._max_steps_reached():
            return True
        return self.max_epochs is not None and self.current_epoch >= self.max_epochs

    def _max_steps_reached(self) -> bool:
        return 0 <= self.max_steps <= self.global_step

    def _train_epoch(self, loader: Iterable[Any], val_loader: Iterable[Any] | None) -> None:
        assert self.module is not None and self.runtime is not None
        module, device = self.module, self.runtime.device
        self.epoch_finished = False
        self.active_metrics = collector = self._collectors["train"]
        collector.reset()
        module.train()
        set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self.current_epoch)  # a DistributedSampler reshuffles per epoch
        self.num_training_batches = length(loader)
        interval = self.val_check_interval
        val_every = evaluation.validation_every(interval, loader) if val_loader else None
        validate_epoch = (self.current_epoch + 1) % self.check_val_every_n_epoch == 0
        dispatch(self, "on_train_epoch_start")
        batches, start = self._epoch_batches(loader)
        step_fn = self._ddp if self._ddp is not None else module.training_step
        for batch_idx, batch, is_last in lookahead(batches, start):
            self.batch_idx = batch_idx
            dispatch(self, "on_train_batch_start", batch, batch_idx)
            batch = move_to_device(batch, device)
            stepped, outputs = self._train_batch(step_fn, batch, batch_idx, is_last)
            dispatch(self, "on_train_batch_end", outputs, batch, batch_idx)
            self.batches_done = batch_idx + 1
            if stepped and self.global_step % self.log_every_n_steps == 0:
                self._log_point(collector, step=True)
            self.epoch_finished = is_last
            if val_loader is not None and validate_epoch and due(val_every, batch_idx, is_last):
                self._validate_in_fit(val_loader)
            if self.should_stop or self._max_steps_reached():
                break
        self._end_train_epoch(collector)

    def _epoch_batches(self, loader: Iterable[Any]) -> tuple[Iterator[Any], int]:
        """The epoch's batch iterator and the index of its first batch (after a resume
        from the middle of an epoch, the batches already trained are drawn and skipped)."""
        resume, self._resume = self._resume, None
        batches, start, self._epoch_rng = ckpt.epoch_batches(loader, resume)
        return batches, start

    def _train_batch(
        self, step_fn: Any, batch: Any, batch_idx: int, is_last: bool
    ) -> tuple[bool, Any]:
        precision = self._precision
        assert precision is not None
        self._micro += 1
        step_now = self._micro >= self.accumulate_grad_batches or is_last
        outputs = optimization.forward_backward(
            step_fn,
            batch,
            batch_idx,
            precision=precision,
            accumulate_grad_batches=self.accumulate_grad_batches,
            no_sync=None if step_now else self._ddp,
            hook=self._hook,
        )
        if step_now:
            self._optimizer_step()
            self._micro = 0
        return step_now, outputs

    def _optimizer_step(self) -> None:
        assert self.optimizer is not None and self._precision is not None
        assert self.module is not None
        optimization.optimizer_step(
            self.optimizer,
            self._precision,
            self.module.parameters(),
            self.gradient_clip_val,
            self._hook,
        )
        self.global_step += 1
        sched = self.lr_scheduler
        if sched is not None and scheduler_due(sched, "step", self.global_step):
            scheduler_step(sched, self.callback_metrics)

    def _end_train_epoch(self, collector: MetricCollector) -> None:
        assert self.runtime is not None
        # An epoch end is a log point: the last step values not yet reported, and the
        # epoch aggregates.
        self._log_point(collector, step=True, epoch=True)
        sched, epochs = self.lr_scheduler, self.current_epoch + 1
        if sched is not None and self.epoch_finished and scheduler_due(sched, "epoch", epochs):
            scheduler_step(sched, self.callback_metrics)
        dispatch(self, "on_train_epoch_end")
        # Whatever the module logged in its own on_train_epoch_end.
        self._log_point(collector, epoch=True)
        if self.epoch_finished:
            # The position is now "start of the next epoch", for checkpoints saved after.
            self.current_epoch += 1
            self.batches_done = 0
            self.epoch_finished = False

    def _validate_in_fit(self, loader: Iterable[Any]) -> None:
        assert self.module is not None
        self.evaluating = self.validated = True
        try:
            self._evaluate("validation", self.module.validation_step, loader)
        finally:
            self.evaluating = False
            self.active_metrics = self._collectors["train"]
        self.module.train()

    # ------------------------------------------------------------------ evaluation

    def _evaluate_stage(
        self,
        stage: str,
        kind: str,
        module: Module,
        loader: Iterable[Any],
        ckpt_path: str | Path | None,
    ) -> dict[str, float]:
        self._attach(module)
        with self._running(stage):
            if ckpt_path is not None:
                module.load_state_dict(ckpt.load(ckpt_path)["state_dict"])
            return self._evaluate(kind, getattr(module, f"{kind}_step"), loader)

    def _evaluate(self, kind: str, step: Any, loader: Iterable[Any]) -> dict[str, float]:
        assert self.runtime is not None
        self.active_metrics = collector = self._collectors[kind]
        collector.reset()
        self._loop(kind, step, loader, keep=False)
        metrics = self._log_point(collector, epoch=True)
        dispatch(self, f"on_{kind}_end")
        return metrics

    def _loop(self, kind: str, step: Any, loader: Iterable[Any], keep: bool) -> list[Any]:
        """:func:`~gpulayer.pytorch.evaluation.run_loop` over ``loader`` with this
        trainer's module, device, precision and hooks."""
        assert self.module is not None and self.runtime is not None and self._precision
        return evaluation.run_loop(
            kind,
            step,
            loader,
            module=self.module,
            device=self.runtime.device,
            precision=self._precision,
            hook=self._hook,
            keep=keep,
        )

    # ------------------------------------------------------------------ reporting

    def _log_point(
        self, collector: MetricCollector, *, step: bool = False, epoch: bool = False
    ) -> dict[str, float]:
        """Read what ``collector`` holds (step values, epoch aggregates), reduced over
        ranks, and report it; answers the reduced metrics."""
        assert self.runtime is not None
        local: dict[str, float] | None = {} if self._rank_sink is not None else None
        metrics: dict[str, float] = {}
        if step:
            metrics.update(collector.read_step(self.runtime, local))
        if epoch:
            metrics.update(collector.read_epoch(self.runtime, local))
        self._report(metrics, local)
        return metrics

    def _report(self, metrics: dict[str, float], local: dict[str, float] | None = None) -> None:
        """A log point: update the metric dicts and hand a record to every sink (and
        this rank's own values to its file, with ``log_rank_metrics``)."""
        if not metrics:
            return
        assert self.runtime is not None
        self.logged_metrics = metrics
        self.callback_metrics.update(metrics)
        for key, value in metrics.items():
            for suffix in ("_step", "_epoch"):
                if key.endswith(suffix):
                    self.callback_metrics[key[: -len(suffix)]] = value
        shown = set().union(*(c.prog_bar for c in self._collectors.values()))
        self.progress_bar_metrics.update({k: v for k, v in metrics.items() if k in shown})
        rank = None if local is not None else self.runtime.rank
        record = MetricRecord(self.global_step, self.current_epoch, rank, metrics)
        for sink in self._sinks:
            sink.write(record)
        if local and self._rank_sink is not None:
            mine = MetricRecord(self.global_step, self.current_epoch, self.runtime.rank, local)
            self._rank_sink.write(mine)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self) -> dict[str, Any]:
        assert self.module is not None and self.optimizer is not None
        assert self._precision is not None
        position = ckpt.Position(
            self.current_epoch, self.global_step, self.batches_done, self.epoch_finished
        )
        checkpoint = ckpt.contents(
            position,
            self.module,
            self.optimizer,
            self.lr_scheduler,
            self._precision,
            self.callbacks,
            self._epoch_rng,
        )
        dispatch(self, "on_save_checkpoint", checkpoint)
        return checkpoint

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        assert self.module is not None and self.optimizer is not None
        assert self._precision is not None
        dispatch(self, "on_load_checkpoint", checkpoint)
        ckpt.restore_states(
            checkpoint,
            self.module,
            self.optimizer,
            self.lr_scheduler,
            self._precision,
            self.callbacks,
        )
        self.global_step = checkpoint["global_step"]
        self.current_epoch, self.batches_done, resume = ckpt.resume_point(checkpoint)
        if resume is not None:
            self._resume = resume
