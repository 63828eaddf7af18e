"""Compatibility shim: the scheduler became ``jupyter_ext.control_plane`` (services).

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .control_plane import ControlPlane as Scheduler

__all__ = ["Scheduler"]
