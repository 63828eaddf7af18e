"""How the command line prints: the one table printer, times, sizes, notes, errors.

Results go to stdout; notes and errors to stderr, so ``$(gpulayer submit ...)``
captures only the job id.
"""

import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from gpulayer import contracts


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "") -> None:
    """Print ``rows`` under ``headers`` in left-aligned columns (``(none)`` when empty)."""
    rows = list(rows)
    if not rows:
        print(f"{indent}(none)")
        return
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    for row in (headers, *rows):
        cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        print(indent + "  ".join(cells).rstrip())


def note(text: str) -> None:
    """A line for people, on stderr."""
    print(text, file=sys.stderr, flush=True)


def fail(message: str, code: int) -> int:
    """Print ``gpulayer: error: ...`` (later lines indented); answers ``code``."""
    first, *rest = message.strip().splitlines() or ["failed"]
    print(f"gpulayer: error: {first}", file=sys.stderr)
    for line in rest:  # e.g. the log tail of a control plane that did not start
        print(f"  {line}", file=sys.stderr)
    return code


def age(ts: datetime | None) -> str:
    """How long ago ``ts`` was, like ``3.2s`` or ``5m``."""
    if ts is None:
        return "-"
    return contracts.format_duration(max((datetime.now(UTC) - ts).total_seconds(), 0.001))


def when(ts: datetime | None) -> str:
    """``ts`` in local time, to the millisecond."""
    return "-" if ts is None else ts.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def size(n: int) -> str:
    """A byte count, like ``12.0GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"


def exit_code(code: int | None) -> str:
    """An exit code, ``-`` while there is none."""
    return "-" if code is None else str(code)
