"""Training progress for people: a widget in notebooks, one line in terminals, lines in logs.

:class:`ProgressBar` picks how to show itself:

``"notebook"``
    in a Jupyter kernel with ipywidgets: a progress bar and a label, updated in
    place.
``"terminal"``
    when the stream is a TTY: one line rewritten with ``\\r``.
``"log"``
    otherwise (a gpulayer job's output, a CI log): a plain line every
    ``log_every_seconds`` and at the end of each epoch.

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
        self._widget: Any = None
        self._next_draw = 0.0
        self._epoch_t0 = 0.0
        self._epoch_batches = 0

    def setup(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """Choose the display for a ``fit`` on the main rank."""
        assert trainer.runtime is not None
        self._active = stage == "fit" and trainer.runtime.is_main
        if self._active:
            stream = self.stream or sys.stdout
            self._display = detect_mode(stream) if self.mode == "auto" else self.mode
            self._widget = None

    def on_train_epoch_start(self, trainer: "Trainer", module: "Module") -> None:
        """Restart the speed measurement."""
        self._epoch_t0 = time.monotonic()
        self._epoch_batches = 0
        self._next_draw = self._epoch_t0 + (
            self.log_every_seconds if self._display == "log" else 0.0
        )

    def on_train_batch_end(
        self, trainer: "Trainer", module: "Module", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Redraw when it is time (a clock read otherwise)."""
        self._epoch_batches += 1
        if not self._active:
            return
        now = time.monotonic()
        if now < self._next_draw:
            return
        pause = self.log_every_seconds if self._display == "log" else self.refresh_seconds
        self._next_draw = now + pause
        self._draw(trainer, now, final=False)

    def on_train_epoch_end(self, trainer: "Trainer", module: "Module") -> None:
        """Draw the epoch's final state (a line of its own in terminal and log modes)."""
        if self._active:
            self._draw(trainer, time.monotonic(), final=True)

    def teardown(self, trainer: "Trainer", module: "Module", stage: str) -> None:
        """Finish the display."""
        if self._active and self._widget is not None:
            self._widget.children[0].bar_style = "success"
        self._active = False

    def describe(self, trainer: "Trainer", now: float) -> str:
        """The text shown: epoch, batch, step, speed and metrics."""
        epoch = f"epoch {trainer.current_epoch + 1}"
        if trainer.max_epochs is not None:
            epoch += f"/{trainer.max_epochs}"
        total = trainer.num_training_batches
        batch = (
            f"{trainer.batches_done}/{total}" if total is not None else f"{trainer.batches_done}"
        )
        elapsed = now - self._epoch_t0
        speed = f"{self._epoch_batches / elapsed:.1f} it/s" if elapsed > 0 else "- it/s"
        parts = [epoch, f"batch {batch}", f"step {trainer.global_step}", speed]
        parts += [f"{k} {_fmt(v)}" for k, v in sorted(trainer.progress_bar_metrics.items())]
        return " | ".join(parts)

    def _draw(self, trainer: "Trainer", now: float, final: bool) -> None:
        text = self.describe(trainer, now)
        if self._display == "notebook":
            self._draw_widget(trainer, text)
            return
        stream = self.stream or sys.stdout
        if self._display == "terminal":
            stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            stream.write(text + "\n")
        stream.flush()

    def _draw_widget(self, trainer: "Trainer", text: str) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        if self._widget is None:
            bar = widgets.IntProgress(min=0, max=1, description="fit")
            self._widget = widgets.HBox([bar, widgets.Label()])
            display(self._widget)  # type: ignore[no-untyped-call]  # IPython's display is unannotated
        bar, label = self._widget.children
        bar.max = max(1, trainer.num_training_batches or trainer.batches_done or 1)
        bar.value = min(trainer.batches_done, bar.max)
        label.value = text


def _fmt(value: float) -> str:
    return f"{value:.4g}"
