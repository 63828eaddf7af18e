"""Compatibility shim: moved to ``jupyter_ext.training_metrics``.

Kept so that code written against the old layout keeps importing while branches
merge (issue 14); new code imports the new module. Remove once nothing uses it.
"""

from .training_metrics import TrainingMetrics, metrics_key

__all__ = ["TrainingMetrics", "metrics_key"]
