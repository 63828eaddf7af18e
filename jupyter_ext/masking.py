"""Masking secret values in what a job prints, before a line is stored or sent.

Pure text rules, no I/O (the secret service decides which values apply to a job;
``docs/secrets.md`` and docs/adr/0109 say why these rules):

- every occurrence of a value is replaced by :data:`MASK`; so is its JSON-escaped
  form; a cell's output (the JSON of a Jupyter message) has each string in it
  masked line by line, as plain output is;
- a value of several lines (a PEM key) is masked line by line: each of its lines
  of at least :data:`MIN_PART` characters, wherever it appears;
- a value cut across two lines (a line over the worker's 64 KiB limit, a cell
  message in fragments, output written in two pieces): a line that *ends* with
  the first :data:`MIN_PART` or more characters of a value, or *starts* with its
  last :data:`MIN_PART` or more, has that part masked. Lines are stored one by one
  and never changed afterwards, so this is decided on each line alone: it may
  mask a few characters that only look like the start or end of a secret, and it
  leaves at most ``MIN_PART - 1`` characters of a value visible at a cut.

Values shorter than :data:`MIN_PART` are refused when a secret is set
(``MIN_SECRET_CHARS``): masking them would blank every line where those few
characters happen to appear.
"""

import json
import re
from collections.abc import Iterable

from gpulayer.contracts import FRAGMENT, MIN_SECRET_CHARS

#: What a masked value shows.
MASK = "***"
#: The shortest piece of a value masked on its own (a line of it, a part at a cut).
MIN_PART = MIN_SECRET_CHARS
_LINES = re.compile(r"\r\n|\r|\n")


class Masker:
    """Masks a fixed set of secret values in lines of text."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = frozenset(v for v in values if v)
        pieces = {p for v in self.values for p in _LINES.split(v) if len(p) >= MIN_PART}
        escaped = {e for v in self.values for e in _escaped(v) if len(e) >= MIN_PART}
        whole = sorted(pieces | escaped, key=len, reverse=True)  # the longest match wins
        self._pattern = re.compile("|".join(map(re.escape, whole))) if whole else None
        # Only values of more than MIN_PART characters can be cut with MIN_PART on a side.
        self._edges = sorted(p for p in pieces if len(p) > MIN_PART)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str) -> str:
        """``text`` with every value (and every part of one at its ends) masked."""
        if self._pattern is None:
            return text
        text = self._pattern.sub(MASK, text)
        start = len(FRAGMENT) if text.startswith(FRAGMENT) else 0
        for piece in self._edges:
            text = _mask_tail(text, piece)
            text = _mask_head(text, piece, start)
        return text

    def mask_line(self, stream: str, text: str) -> str:
        """One log line of ``stream``: a cell's message (``iopub``, the JSON of a
        Jupyter message) has every string in it masked line by line, so a value cut
        by a newline inside the message is masked as in plain output; a fragment of
        a long message, or anything else, is masked as text."""
        if self._pattern is None:
            return text
        if stream == "iopub" and not text.startswith(FRAGMENT):
            try:
                message = json.loads(text)
            except ValueError:
                return self.mask(text)
            masked = self._mask_strings(message)
            if masked != message:
                return json.dumps(masked, ensure_ascii=False, separators=(",", ":"))
            return self.mask(text)  # an escaped form (a quote or backslash in a value)
        return self.mask(text)

    def _mask_strings(self, value: object) -> object:
        if isinstance(value, str):
            return "".join(
                self.mask(body) + ending
                for line in value.splitlines(keepends=True) or [""]
                for body, ending in [_cut_ending(line)]
            )
        if isinstance(value, list):
            return [self._mask_strings(v) for v in value]
        if isinstance(value, dict):
            return {k: self._mask_strings(v) for k, v in value.items()}
        return value

    def mask_optional(self, text: str | None) -> str | None:
        """:meth:`mask` for a text that may be missing."""
        return None if text is None else self.mask(text)


def _cut_ending(line: str) -> tuple[str, str]:
    """``line`` split into its text and its line ending."""
    body = line.rstrip("\r\n")
    return body, line[len(body) :]


def _escaped(value: str) -> set[str]:
    """How ``value`` reads inside a JSON string (either way of writing non-ASCII)."""
    return {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]} - {value}


def _mask_tail(text: str, piece: str) -> str:
    """``text`` with its end masked when it is a start of ``piece`` (``MIN_PART`` or
    more characters, but not all of it: a whole value was masked already)."""
    first = max(0, len(text) - len(piece) + 1)
    i = text.find(piece[0], first)
    while i >= 0 and len(text) - i >= MIN_PART:
        if piece.startswith(text[i:]):
            return text[:i] + MASK
        i = text.find(piece[0], i + 1)
    return text


def _mask_head(text: str, piece: str, start: int) -> str:
    """``text`` with its beginning (from ``start``) masked when it is an end of ``piece``."""
    last = min(len(text), start + len(piece) - 1)
    i = text.rfind(piece[-1], start, last)
    while i >= 0 and i + 1 - start >= MIN_PART:
        if piece.endswith(text[start : i + 1]):
            return text[:start] + MASK + text[i + 1 :]
        i = text.rfind(piece[-1], start, i)
    return text
