"""Moved to :mod:`gpulayer.cli.tokens`; this path stays importable."""

from gpulayer.cli.tokens import add_parsers

__all__ = ["add_parsers"]
