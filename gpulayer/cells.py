"""Moved to :mod:`gpulayer.client.cells`; this path stays importable (benchmarks, old imports)."""

from gpulayer.client.cells import (
    MessageDecoder,
    RemoteCell,
    cell_spec,
    ensure_session,
    log_text,
    plain_text,
    remote_error,
    strip_ansi,
    submit,
)

#: The handle's former name.
CellRun = RemoteCell

__all__ = [
    "CellRun",
    "MessageDecoder",
    "RemoteCell",
    "cell_spec",
    "ensure_session",
    "log_text",
    "plain_text",
    "remote_error",
    "strip_ansi",
    "submit",
]
