"""The gpulayer exception tree.

Each error has a stable ``code`` that travels in the JSON error body
(:class:`gpulayer.contracts.ErrorBody`), so the control plane raises it once and
the client turns the body back into the same class::

    GpulayerError
    ├── ConfigError            no control plane configured, bad config file
    ├── ValidationError        a request or option is malformed        (400)
    │   └── PayloadError       a call or value cannot be pickled or read here
    ├── AuthError              missing, unknown or expired token       (401)
    │   ├── Forbidden          the token's role may not do this        (403)
    │   └── RateLimited        too many failed logins from one address (429)
    ├── NotFound               unknown job, worker, task, artifact     (404)
    ├── Conflict               the request does not fit the state      (409)
    │   ├── InvalidTransition  e.g. cancel a job that already ended
    │   └── StaleAttempt       a report for a task its job no longer runs
    ├── PayloadTooLarge        body, bundle or artifact over a limit   (413)
    ├── QuotaExceeded          an owner's quota is used up             (429)
    ├── StorageError           the control plane cannot write its disk (503)
    │   └── StorageFull        ... because it is full or over quota    (507)
    ├── TransferError          a download or upload arrived corrupt or cut short
    ├── ApiError               any other answer the client did not expect
    │   └── ConnectionFailed   the control plane cannot be reached
    │       └── CertificateMismatch  its TLS certificate is not the pinned one
    └── JobFailed              a job ended in failed / timed_out / lost / cancelled
        └── RemoteError        a remote function raised what cannot be re-raised here
"""

import errno
import os
from typing import ClassVar


class GpulayerError(Exception):
    """Root of every gpulayer error."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ConfigError(GpulayerError):
    """gpulayer is not configured (no URL or token), or its config is unusable."""

    code = "config_error"


class ValidationError(GpulayerError):
    """A request body, query argument or option is malformed."""

    code = "invalid"


class PayloadError(ValidationError):
    """A call or value cannot be pickled here, or a payload comes from another
    Python or a newer gpulayer (the message says what to do)."""

    code = "bad_payload"


class AuthError(GpulayerError):
    """The request carried no usable credentials."""

    code = "unauthenticated"


class Forbidden(AuthError):
    """The credentials are valid but may not do this."""

    code = "forbidden"


class RateLimited(AuthError):
    """Too many failed logins from this client address; try again later."""

    code = "rate_limited"

    def __init__(
        self, message: str, *, retry_after_seconds: float = 0.0, field: str | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.retry_after_seconds = retry_after_seconds


class NotFound(GpulayerError):
    """An id or name that does not exist."""

    code = "not_found"


class Conflict(GpulayerError):
    """The request contradicts the current state."""

    code = "conflict"


class InvalidTransition(Conflict):
    """A state change that the state machine does not allow."""

    code = "invalid_transition"


class StaleAttempt(Conflict):
    """A worker reported on a task that is no longer its job's current attempt (it
    was given up as ``lost``, or a newer attempt replaced it): the report is refused
    and the worker stops the task (docs/adr/0082-fencing.md)."""

    code = "stale_attempt"


class PayloadTooLarge(GpulayerError):
    """A body, bundle or artifact is over its configured limit."""

    code = "too_large"


class QuotaExceeded(GpulayerError):
    """An owner's quota (e.g. queued jobs) is used up; the message names the limit
    and the ``c.GpulayerApp`` trait that sets it."""

    code = "quota_exceeded"


class StorageError(GpulayerError):
    """The control plane cannot store what it was sent: its disk or database is
    read-only or failing (503). Nothing of the request was stored; retry later."""

    code = "storage_unavailable"


class StorageFull(StorageError):
    """The control plane's disk is full or over its quota (507); nothing of the
    request was stored, and it works again once space is freed."""

    code = "storage_full"


class TransferError(GpulayerError):
    """A download or upload did not arrive whole: its size or sha256 is not what
    was announced (nothing was written in its place)."""

    code = "transfer_failed"


class ApiError(GpulayerError):
    """An answer from the control plane that the client did not expect."""

    code = "api_error"

    def __init__(
        self,
        message: str,
        *,
        method: str = "",
        url: str = "",
        status: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message, field=field)
        self.method = method
        self.url = url
        self.status = status


class ConnectionFailed(ApiError):
    """The control plane could not be reached."""

    code = "connection_failed"


class CertificateMismatch(ConnectionFailed):
    """The server's TLS certificate does not have the pinned SHA-256 fingerprint.

    Nothing (no token, no body) was sent: the check runs right after the handshake.
    """

    code = "certificate_mismatch"


class JobFailed(GpulayerError):
    """A job ended without succeeding.

    Carries the job's id, final state, reason and exit code, and the worker
    it ran on, so a notebook shows where it failed.
    """

    code = "job_failed"

    def __init__(
        self,
        message: str,
        *,
        job_id: str,
        state: str,
        reason: str | None = None,
        exit_code: int | None = None,
        worker: str | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state
        self.reason = reason
        self.exit_code = exit_code
        self.worker = worker

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the local client stack."""
        where = f" on worker {self.worker}" if self.worker else ""
        return [f"JobFailed: job {self.job_id} {self.state}{where}: {self.reason or self.message}"]


class RemoteError(JobFailed):
    """A remote function raised an exception that cannot be re-raised here (its
    class does not unpickle in this process); carries its type name and the
    remote traceback, which IPython shows as the error."""

    code = "remote_error"

    def __init__(
        self,
        message: str,
        *,
        remote_type: str,
        remote_traceback: str,
        job_id: str,
        worker: str | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, state="failed", reason=message, worker=worker)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return f"{self.remote_type}: {self.message}\n\n{_where(self.job_id, self.worker)}"

    def _render_traceback_(self) -> list[str]:
        """IPython shows the remote traceback instead of the local client stack."""
        return [*self.remote_traceback.rstrip().splitlines(), _where(self.job_id, self.worker)]


class RemoteTraceback(Exception):
    """The cause attached to a re-raised remote exception: its str is the remote traceback."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text.rstrip()


def _where(job_id: str, worker: str | None) -> str:
    return f"(raised in job {job_id}" + (f" on worker {worker})" if worker else ")")


_BY_CODE: dict[str, type[GpulayerError]] = {
    cls.code: cls
    for cls in (
        ConfigError,
        ValidationError,
        PayloadError,
        AuthError,
        Forbidden,
        RateLimited,
        NotFound,
        Conflict,
        InvalidTransition,
        PayloadTooLarge,
        StaleAttempt,
        QuotaExceeded,
        StorageError,
        StorageFull,
        TransferError,
    )
}

#: ``errno`` values that mean "no space left": answered 507.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_error(exc: OSError, where: "str | os.PathLike[str]") -> StorageError | None:
    """The :class:`StorageError` a failed write of the control plane's storage at
    ``where`` stands for (None for an ``OSError`` that is not about the storage,
    e.g. a missing file): full or over quota → :class:`StorageFull` (507),
    read-only or any other I/O failure → :class:`StorageError` (503)."""
    path = os.fspath(where)
    if exc.errno in _FULL:
        what = "disk quota is exceeded" if exc.errno == errno.EDQUOT else "disk is full"
        return StorageFull(f"the control plane's {what} ({path}); free space there and retry")
    if exc.errno == errno.EROFS:
        return StorageError(f"the control plane's storage is read-only ({path}); retry later")
    if exc.errno in (errno.EIO, errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE):
        return StorageError(f"the control plane cannot write its storage ({path}): {exc.strerror}")
    return None


def error_for_code(code: str) -> type[GpulayerError] | None:
    """The exception class that a JSON error body's ``code`` stands for."""
    return _BY_CODE.get(code)
