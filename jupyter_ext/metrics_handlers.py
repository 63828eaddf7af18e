"""Compatibility shim: moved to ``jupyter_ext.api.prometheus``.

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .api.prometheus import ROUTES, MetricsHandler

__all__ = ["ROUTES", "MetricsHandler"]
