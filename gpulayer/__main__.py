"""``python -m gpulayer``: the ``gpulayer`` command line."""

import sys

from gpulayer.cli import main

if __name__ == "__main__":
    sys.exit(main())
