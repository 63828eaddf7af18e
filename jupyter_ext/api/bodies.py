"""Request bodies: JSON that cannot crash a handler.

:func:`decode_json` turns a body into a contract model or a
:class:`~gpulayer.errors.ValidationError` naming the field, never a 500: JSON
nested deeper than Python's recursion limit, integers of thousands of digits,
text that is not valid Unicode (a lone surrogate cannot be stored or sent back)
and integers SQLite cannot hold (at most 64 bits) are all refused here, for every
route at once, before a service sees the request.
"""

import json
from typing import Any, TypeVar

import pydantic

from gpulayer.errors import ValidationError

from .errors import printable, validation_error

M = TypeVar("M", bound=pydantic.BaseModel)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Every byte of a body as ``0`` (a digit or ``_``) or ``.`` (anything else), to find
#: a run of 19 with one substring search (a regular expression costs 7x more).
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 or i == 0x5F else 0x2E for i in range(256))
_NINETEEN_DIGITS = b"0" * 19


def _maybe_unstorable(body: bytes) -> bool:
    """Whether an ASCII JSON text may hold a lone surrogate (a ``\\u`` escape) or an
    integer past 64 bits, as a number or as a string pydantic reads as one (19 digits
    or ``_`` in a row: ``"1_000"`` is 1000 to pydantic); a NUL means UTF-16 or UTF-32,
    where digits are not in a row. A model parsed from a body without any of them
    holds no such value: pydantic reads no other text as an integer and refuses a
    float past 64 bits as one."""
    return b"\\u" in body or b"\x00" in body or _NINETEEN_DIGITS in body.translate(_DIGITS)


def decode_json(body: bytes, model: type[M]) -> M:
    """``body`` (a JSON object) as ``model``.

    Raises
    ------
    ValidationError
        Naming the offending field where there is one.
    """
    try:
        data = json.loads(body or b"null")
    except RecursionError as e:
        raise ValidationError("request body is nested too deeply") from e
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, over-long integers
        raise ValidationError(f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValidationError("request body must be a JSON object")
    suspect = not body.isascii() or _maybe_unstorable(body)  # a walk costs more than a scan
    if suspect:
        check_storable(data)  # before pydantic, whose messages would echo a bad key
    try:
        parsed = model.model_validate(data)
    except pydantic.ValidationError as e:
        raise validation_error(e) from e
    except RecursionError as e:
        raise ValidationError("request body is nested too deeply") from e
    if suspect:
        check_storable(parsed.model_dump())  # numbers pydantic read from strings
    return parsed


def check_storable(value: Any) -> None:
    """Refuse text with lone surrogates and integers beyond 64 bits anywhere in
    ``value`` (a model's dump), naming the first such field.

    Raises
    ------
    ValidationError
        With the field's dotted path.
    """
    if _storable(value):
        return  # the walk below names the field; this one only looks
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            _check_text(path, v)
        elif isinstance(v, bool):
            continue
        elif isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise ValidationError(
                    f"{path or 'body'}: integer out of range (at most 2**63 - 1)",
                    field=path or None,
                )
        elif isinstance(v, dict):
            for key, item in v.items():
                name = printable(key) if isinstance(key, str) else str(key)
                sub = f"{path}.{name}" if path else name
                if isinstance(key, str):
                    _check_text(sub, key)
                stack.append((sub, item))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(v))


def _storable(value: Any) -> bool:
    """:func:`check_storable`'s test without its field paths (3x cheaper)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not _text_ok(v):
                return False
        elif isinstance(v, bool):
            continue
        elif isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                return False
        elif isinstance(v, dict):
            for key in v:
                if isinstance(key, str) and not _text_ok(key):
                    return False
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return True


def _text_ok(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(path: str, text: str) -> None:
    if not _text_ok(text):
        raise ValidationError(
            f"{path or 'body'}: text is not valid Unicode (a lone surrogate)", field=path or None
        )


def number_arg(raw: str | None, name: str, default: float, hi: float) -> float:
    """A numeric query argument in ``[0, hi]`` (``default`` when absent).

    Raises
    ------
    ValidationError
        Naming the argument when it is not a number, or negative.
    """
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise ValidationError(f"query argument {name!r} must be a number", field=name) from e
    if not 0 <= value <= 1e9:
        raise ValidationError(f"query argument {name!r} must be >= 0", field=name)
    return min(value, hi)


def integer_arg(raw: str | None, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query argument in ``[lo, hi]`` (``default`` when absent).

    Raises
    ------
    ValidationError
        Naming the argument when it is not an integer in range.
    """
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise ValidationError(f"query argument {name!r} must be an integer", field=name) from e
    if not lo <= value <= hi:
        raise ValidationError(f"query argument {name!r} must be in [{lo}, {hi}]", field=name)
    return value
