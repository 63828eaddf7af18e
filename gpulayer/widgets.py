"""Moved to :mod:`gpulayer.notebook.widgets` (charts: :mod:`gpulayer.notebook.charts`,
reprs: :mod:`gpulayer.notebook.render`); this path stays importable."""

from gpulayer.notebook.charts import svg_chart
from gpulayer.notebook.render import connection_bundle, job_bundle, job_summary
from gpulayer.notebook.widgets import JobMonitor, JobsProgress, WorkersTable

__all__ = [
    "JobMonitor",
    "JobsProgress",
    "WorkersTable",
    "connection_bundle",
    "job_bundle",
    "job_summary",
    "svg_chart",
]
