"""Moved to :mod:`gpulayer.client.jobs`; this path stays importable (old pickles, old imports)."""

from gpulayer.client.jobs import Job, failure_of, submit

__all__ = ["Job", "failure_of", "submit"]
