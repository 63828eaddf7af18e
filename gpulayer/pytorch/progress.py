"""Training progress for people, drawn by tqdm (:mod:`gpulayer.notebook.progress`).

:class:`ProgressBar` picks how to show itself:

``"notebook"``
    in a Jupyter kernel with ipywidgets: tqdm's widget bar, one for the whole fit,
    reset at each epoch.
``"terminal"``
    when the stream is a TTY: tqdm's line, rewritten in place; each epoch's last
    state stays on a line of its own.
``"log"``
    otherwise (a gpulayer job's output, a CI log): tqdm's text as a plain line every
    ``log_every_seconds`` and at the end of each epoch, never a ``\\r``.

It runs on the main rank only, redraws at most every ``refresh_seconds`` and
shows only metrics already read at log points (``prog_bar=True``), so it never
makes the training loop wait for the device.
"""

import sys
import time
from typing import TYPE_CHECKING, Any, Literal, TextIO

from gpulayer.pytorch.callbacks import Callback

if TYPE_CHECKING:
    from gpulayer.pytorch.module import Module
    from gpulayer.pytorch.trainer import Trainer

Mode = Literal["auto", "notebook", "terminal", "log"]
#: A ``"log"`` line: ``epoch 3/30: 64/64 [00:01<00:00, 410.32it/s, step 192, train/loss 0.0102]``.
TEXT_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def _in_kernel() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and getattr(shell, "kernel", None) is not None


def detect_mode(stream: TextIO) -> Literal["notebook", "terminal", "log"]:
    """The display for this process: see the module docstring."""
    if _in_kernel():
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            return "log"
        return "notebook"
    isatty = getattr(stream, "isatty", None)
    return "terminal" if isatty is not None and isatty() else "log"


class _Discard:
    """Where a ``"log"`` bar draws: nowhere (its text is written as whole lines)."""

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class ProgressBar(Callback):
    """Shows epoch, batch, step, speed and the ``prog_bar`` metrics while fitting.

    Parameters
    ----------
    mode
        ``"auto"`` or a fixed display (see the module docstring).
    refresh_seconds
        Shortest time between two redraws of the widget or terminal line.
    log_every_seconds
        Time between two lines in ``"log"`` mode.
    stream
        Where text goes (default ``sys.stdout``, looked up when fitting starts).
    """

    def __init__(
        self,
        mode: Mode = "auto",
        refresh_seconds: float = 0.2,
        log_every_seconds: float = 30.0,
        stream: TextIO | None = None,
    ) -> None:
        self.mode = mode
        self.refresh_seconds = refresh_seconds
        self.log_every_seconds = log_every_seconds
        self.stream = stream
        self._active = False
        self._display: Literal["notebook", "terminal", "log"] = "log"
        self._bar: Any = None
        self._next_draw = 0.0

    def setup(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """Choose the display for a ``fit`` on the main rank."""
        assert trainer.runtime is not None
        self._active = stage == "fit" and trainer.runtime.is_main
        if self._active:
            stream = self.stream or sys.stdout
            self._display = detect_mode(stream) if self.mode == "auto" else self.mode
            self._bar = None

    def on_train_epoch_start(self, trainer: "Trainer", module: "Module") -> None:
        """A bar for the epoch (the notebook's one bar, reset)."""
        if not self._active:
            return
        total = trainer.num_training_batches
        if self._bar is None:
            self._bar = self._new_bar(total)
        else:
            self._bar.reset(total=total)
        self._bar.set_description_str(self._epoch(trainer), refresh=False)
        self._next_draw = time.monotonic() + (
            self.log_every_seconds if self._display == "log" else 0.0
        )

    def on_train_batch_end(
        self, trainer: "Trainer", module: "Module", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the batch; redraw when it is time (a clock read otherwise)."""
        if not self._active or self._bar is None:
            return
        self._bar.update(batch_idx + 1 - self._bar.n)  # after a resume it starts mid-epoch
        now = time.monotonic()
        if now < self._next_draw:
            return
        pause = self.log_every_seconds if self._display == "log" else self.refresh_seconds
        self._next_draw = now + pause
        self._draw(trainer)

    def on_train_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """Draw the epoch's final state (a line of its own in terminal and log modes)."""
        if not self._active or self._bar is None:
            return
        self._draw(trainer)
        if self._display == "terminal":
            self._bar.close()
            self._bar = None

    def teardown(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """Finish the display: the fit is over, so a stopped epoch is no failure."""
        if self._bar is not None:
            self._bar.total = self._bar.n  # tqdm's widget turns green, not red
            self._bar.close()
            self._bar = None
        self._active = False

    def describe(self, trainer: "Trainer") -> str:
        """The text shown now: epoch, batches, time, speed, step and metrics."""
        return str(self._bar) if self._bar is not None else self._epoch(trainer)

    def _new_bar(self, total: int | None) -> Any:
        options: dict[str, Any] = {"total": total, "leave": True, "dynamic_ncols": True}
        if self._display == "notebook":
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm(**options)
        from tqdm import tqdm

        if self._display == "terminal":
            return tqdm(file=self.stream or sys.stdout, mininterval=self.refresh_seconds, **options)
        return tqdm(file=_Discard(), ascii=True, bar_format=TEXT_FORMAT, mininterval=1e9, **options)

    def _draw(self, trainer: "Trainer") -> None:
        parts = [f"step {trainer.global_step}"]
        parts += [f"{k} {_fmt(v)}" for k, v in sorted(trainer.progress_bar_metrics.items())]
        self._bar.set_postfix_str(", ".join(parts), refresh=self._display != "log")
        if self._display == "log":
            stream = self.stream or sys.stdout
            stream.write(str(self._bar) + "\n")
            stream.flush()

    @staticmethod
    def _epoch(trainer: "Trainer") -> str:
        epoch = f"epoch {trainer.current_epoch + 1}"
        return epoch + (f"/{trainer.max_epochs}" if trainer.max_epochs is not None else "")


def _fmt(value: float) -> str:
    return f"{value:.4g}"
