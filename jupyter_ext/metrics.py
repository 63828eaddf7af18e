"""Compatibility shim: the Prometheus exposition moved to ``jupyter_ext.prometheus``.

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .prometheus import LATENCY_BUCKETS, Instruments, Snapshot, StateCollector

__all__ = ["LATENCY_BUCKETS", "Instruments", "Snapshot", "StateCollector"]
