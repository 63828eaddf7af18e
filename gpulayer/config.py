"""Moved to :mod:`gpulayer.client.config`; this path stays importable."""

from gpulayer.client.config import (
    ConnectionConfig,
    config_path,
    jupyter_parent,
    load,
    resolve,
    save,
)

__all__ = ["ConnectionConfig", "config_path", "jupyter_parent", "load", "resolve", "save"]
