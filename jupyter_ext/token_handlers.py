"""Compatibility shim: moved to ``jupyter_ext.api.tokens``.

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .api.tokens import ROUTES, TokenHandler, TokensHandler

__all__ = ["ROUTES", "TokenHandler", "TokensHandler"]
