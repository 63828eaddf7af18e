"""The one place domain errors become HTTP statuses and error bodies.

The client maps them back by ``code`` (``gpulayer/errors.py``). No traceback ever
leaves the server.
"""

import pydantic
from tornado import web

from gpulayer.contracts import ErrorBody
from gpulayer.errors import (
    AuthError,
    Conflict,
    Forbidden,
    GpulayerError,
    InvalidTransition,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    StorageError,
    StorageFull,
    ValidationError,
)

STATUS: dict[type[GpulayerError], int] = {
    ValidationError: 400,
    AuthError: 401,
    Forbidden: 403,
    RateLimited: 429,
    NotFound: 404,
    Conflict: 409,
    InvalidTransition: 409,
    PayloadTooLarge: 413,
    QuotaExceeded: 429,
    StorageFull: 507,
    StorageError: 503,
}
_CODE_BY_STATUS = {
    400: "invalid",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    429: "rate_limited",
    503: "unavailable",
    507: "storage_full",
}


def status_of(err: GpulayerError) -> int:
    """The HTTP status of a domain error (500 for one not in :data:`STATUS`)."""
    for cls in type(err).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(exc: BaseException | None, status: int, reason: str) -> ErrorBody:
    """The ``ErrorBody`` of an exception a handler raised (or of a bare status)."""
    if isinstance(exc, GpulayerError):
        field = None if exc.field is None else printable(exc.field)
        return ErrorBody(code=exc.code, message=printable(exc.message), field=field)
    if isinstance(exc, web.HTTPError):
        return ErrorBody(
            code=_CODE_BY_STATUS.get(status, "error"),
            message=exc.log_message or exc.reason or reason,
        )
    return ErrorBody(code="internal", message="internal error; see the server log")


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped: an error that echoes bad input must
    still serialize."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def validation_error(e: pydantic.ValidationError, prefix: str = "") -> ValidationError:
    """A pydantic error as one message naming every offending field."""
    parts, first = [], None
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        loc = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "body"
        first = first or loc
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field '{loc}'")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}")
    return ValidationError("; ".join(parts), field=first)
