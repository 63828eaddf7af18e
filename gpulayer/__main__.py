"""``python -m gpulayer`` and the ``gpulayer`` script: the command line.

Both run in a process of their own, so they skip what none of gpulayer's commands
uses: httpx imports its own command line (click, rich and pygments, ~20 ms of every
worker's start) whenever those happen to be installed (ADR 0141). A notebook that
imports gpulayer keeps httpx as it is.
"""

import sys


def main() -> int:
    """The ``gpulayer`` command, with ``sys.argv``."""
    from gpulayer.startup import hold_gc, skip_pydantic_plugins

    hold_gc()  # released once the command is parsed, or once a worker registered (ADR 0147)
    skip_pydantic_plugins()  # a gpulayer command uses none (ADR 0148)
    # A None entry makes `from ._main import main` in httpx fail, and httpx then
    # defines a stand-in; typeshed allows only modules in sys.modules.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from gpulayer.cli import main as cli

    return cli()


if __name__ == "__main__":
    sys.exit(main())
