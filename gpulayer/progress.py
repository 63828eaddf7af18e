"""Moved to :mod:`gpulayer.notebook.progress`; this path stays importable."""

from gpulayer.notebook.progress import Progress, TextProgress, WidgetProgress, in_notebook

__all__ = ["Progress", "TextProgress", "WidgetProgress", "in_notebook"]
