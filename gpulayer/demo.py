"""Moved to :mod:`gpulayer.cli.demo`; this path stays importable (``python -m gpulayer.demo``)."""

import sys

from gpulayer.cli.demo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
