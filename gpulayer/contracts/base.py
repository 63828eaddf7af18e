"""What every contract module shares: the version, durations, base models, field types."""

import math
import re
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, StringConstraints

API_VERSION: Final = "gpulayer.dev/v1alpha1"
API_PREFIX: Final = "/gpulayer/api/v1"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
MAX_DURATION_SECONDS: Final = 100 * 365.25 * 86400.0
"""Longest duration any field takes (100 years): later times cannot be stored or shown."""
#: A duration of several parts, largest first, as :func:`format_duration` writes them.
_COMPOUND = re.compile(r"^\s*(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+\s*$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Seconds from ``90``, ``"90s"``, ``"10m"``, ``"1.5h"``, ``"2d"``, or several
    parts like ``"1h30m"`` and ``"4m05s"`` (what :func:`format_duration` prints).

    Raises
    ------
    ValueError
        For anything else, with a message that shows the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '90s', '10m', '2h'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value)
        m = _DURATION.match(text)
        if m:
            seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        elif _COMPOUND.match(text):
            seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))
        else:
            raise ValueError(
                f"{value!r} is not a duration; use seconds or a string like '90s', '10m',"
                " '2h', '1h30m'"
            )
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
        raise ValueError("a duration must be at most 100 years")
    return seconds


def format_duration(seconds: float | None) -> str:
    """Short human form of a duration: ``850ms``, ``12.3s``, ``4m05s``, ``2h10m``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _optional_duration(value: object) -> float | None:
    return None if value is None else parse_duration(value)


#: A field given as seconds or a string like ``"10m"`` (:func:`parse_duration`), or None.
OptionalDuration = Annotated[float | None, BeforeValidator(_optional_duration)]


#: Models and type adapters build their validators at first use, not at import: each
#: process uses a few of the ~80 models, and building them all took ~0.1 s of every
#: control plane's, worker's and client's start (ADR 0141).
DEFERRED = ConfigDict(defer_build=True)


class RequestModel(BaseModel):
    """Base of every request body: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", **DEFERRED)


class DocumentModel(BaseModel):
    """Base of every answer: tolerant of fields added by newer servers."""

    model_config = ConfigDict(extra="ignore", **DEFERRED)


#: What no name, label or other text shown to people may hold: C0 and C1 controls
#: (newline and tab too), DEL, line and paragraph separators, and the bidirectional
#: marks, embeddings, overrides and isolates that make text display in another
#: order than it is stored ("Trojan Source").
_UNSAFE_TEXT = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def plain_text(value: str) -> str:
    """``value``, if it holds no control or bidirectional-override characters.

    Raises
    ------
    ValueError
        Naming the first such character.
    """
    if found := _UNSAFE_TEXT.search(value):
        raise ValueError(
            "must not contain control or bidirectional-override characters"
            f" (found U+{ord(found.group()):04X})"
        )
    return value


Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\w.\-@ ]+$")]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[\w.\-/]+$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
LabelValue = Annotated[str, StringConstraints(max_length=256), AfterValidator(plain_text)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


Accelerator = Literal["cuda", "rocm", "mps", "cpu"]


INLINE_BYTES = 256 * 1024
"""Payloads and results up to this size travel inline (base64 in JSON); larger ones
go through the blob store."""


#: Model config of models with ``bytes`` fields: base64 in JSON, both ways.
BASE64_BYTES = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
