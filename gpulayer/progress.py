"""Moved to :mod:`gpulayer.notebook.progress`; this path stays importable."""

from gpulayer.notebook.progress import Bar, Progress, bar, in_notebook, transfer

__all__ = ["Bar", "Progress", "bar", "in_notebook", "transfer"]
