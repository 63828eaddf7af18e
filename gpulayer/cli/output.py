"""How the command line prints: the one table printer, ``-o json`` documents, times,
sizes, notes, errors.

Results go to stdout; notes and errors to stderr, so ``$(gpulayer submit ...)``
captures only the job id.

Text that others wrote (job output, job and worker names, labels, reasons, error
messages) passes through :func:`plain` before it reaches the terminal, so a job
cannot move the cursor, retitle the window, hide lines or plant an OSC 8 link in
someone else's terminal. ``table``, ``note``, ``fail`` and ``say`` apply it
themselves; ``gpulayer logs --raw`` prints a job's output unchanged.
"""

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from pydantic import BaseModel

from gpulayer import contracts

#: Terminal control: CSI sequences (``ESC [`` or the 8-bit ``0x9b``), the string
#: sequences OSC, DCS, SOS, PM and APC up to their terminator (BEL or ST; an unended
#: one to the end of its line), other ``ESC`` sequences, and every other C0 and C1
#: control and DEL. Newline and tab stay.
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def plain(text: str) -> str:
    """``text`` without terminal control sequences or control characters (newline
    and tab stay): what the CLI prints of anything it did not write itself."""
    return _CONTROL.sub("", text)


def say(text: str, *, raw: bool = False, file: TextIO | None = None) -> None:
    """Print a line of results (stdout unless ``file``), through :func:`plain`
    unless ``raw``."""
    print(text if raw else plain(text), file=file or sys.stdout, flush=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "") -> None:
    """Print ``rows`` under ``headers`` in left-aligned columns (``(none)`` when empty).

    Cells go through :func:`plain`, and a newline or tab in one becomes a space, so
    each row stays one line.
    """
    lines = [[_cell(c) for c in row] for row in rows]
    if not lines:
        print(f"{indent}(none)")
        return
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *lines, strict=False)]
    for row in (headers, *lines):
        cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        print(indent + "  ".join(cells).rstrip())


def _cell(value: object) -> str:
    return plain(str(value)).replace("\n", " ").replace("\t", " ")


def note(text: str) -> None:
    """A line for people, on stderr (through :func:`plain`)."""
    print(plain(text), file=sys.stderr, flush=True)


def fail(message: str, code: int) -> int:
    """Print ``gpulayer: error: ...`` (later lines indented); answers ``code``."""
    first, *rest = plain(message).strip().splitlines() or ["failed"]
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


def document(data: BaseModel | Mapping[str, Any]) -> None:
    """Print what ``-o json`` asks for: a model's JSON (or a mapping of models'),
    indented; every control and non-ASCII character escaped, so nothing reaches the
    terminal raw and any JSON reader reads it back."""
    value = data.model_dump(mode="json") if isinstance(data, BaseModel) else _plain_json(data)
    print(json.dumps(value, indent=2, ensure_ascii=True), flush=True)


def _plain_json(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    return value
