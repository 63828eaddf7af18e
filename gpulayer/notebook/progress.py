"""Progress of many calls: a widget in a notebook, a one-line bar in a terminal.

:meth:`Progress.auto` picks what fits where the code runs; elsewhere (a script
whose output goes to a file, CI) it shows nothing unless asked.
"""

import sys
import time
from typing import Any, TextIO


class Progress:
    """Counts finished items out of ``total``; this base class shows nothing."""

    def __init__(self, total: int, desc: str = "") -> None:
        self.total = total
        self.desc = desc
        self.done = 0
        self.closed = False

    @classmethod
    def auto(cls, total: int, desc: str, want: bool | None = None) -> "Progress":
        """The progress display for here: ``want`` None decides by the environment,
        False shows nothing, True shows a text bar where no widget can be shown."""
        if want is False or total <= 0:
            return cls(total, desc)
        if in_notebook():
            try:
                return WidgetProgress(total, desc)
            except ImportError:  # ipywidgets missing: fall back to text
                pass
        if want or sys.stderr.isatty():
            return TextProgress(total, desc, sys.stderr)
        return cls(total, desc)

    def update(self, n: int = 1) -> None:
        """``n`` more items finished."""
        self.done = min(self.total, self.done + n)
        self._show()

    def close(self) -> None:
        """The run ended (or was stopped); final display."""
        if not self.closed:
            self.closed = True
            self._finish()

    def _show(self) -> None:
        pass

    def _finish(self) -> None:
        pass


class TextProgress(Progress):
    """``desc  37/100 [=======>            ]  12.3 s`` on one updating line."""

    _WIDTH = 30
    _MIN_INTERVAL = 0.1

    def __init__(self, total: int, desc: str, stream: TextIO) -> None:
        super().__init__(total, desc)
        self._stream = stream
        self._start = time.monotonic()
        self._last = 0.0
        self._show(force=True)

    def _show(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._MIN_INTERVAL and self.done < self.total:
            return
        self._last = now
        filled = int(self._WIDTH * self.done / max(1, self.total))
        bar = (
            "=" * filled + (">" if filled < self._WIDTH else "") + " " * (self._WIDTH - filled - 1)
        )
        elapsed = now - self._start
        self._stream.write(f"\r{self.desc}  {self.done}/{self.total} [{bar}] {elapsed:6.1f} s")
        self._stream.flush()

    def _finish(self) -> None:
        self._show(force=True)
        self._stream.write("\n")
        self._stream.flush()


class WidgetProgress(Progress):
    """An ipywidgets progress bar with a ``done/total`` label."""

    def __init__(self, total: int, desc: str) -> None:
        import ipywidgets as w
        from IPython.display import display

        super().__init__(total, desc)
        self.bar = w.IntProgress(value=0, min=0, max=total, description=desc[:20])
        self.label = w.Label(f"0/{total}")
        self.box: Any = w.HBox([self.bar, self.label])
        display(self.box)

    def _show(self) -> None:
        self.bar.value = self.done
        self.label.value = f"{self.done}/{self.total}"

    def _finish(self) -> None:
        self._show()
        self.bar.bar_style = "success" if self.done >= self.total else "warning"


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (not a terminal IPython)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")
