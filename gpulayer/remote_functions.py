"""Moved to :mod:`gpulayer.functions`; this path stays importable (old imports, and
objects pickled by reference under it)."""

from gpulayer.functions import Call, MapRun, RemoteFunction, as_completed, remote, wait

__all__ = ["Call", "MapRun", "RemoteFunction", "as_completed", "remote", "wait"]
