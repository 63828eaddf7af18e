"""Training metrics: the points a training run logs (not the Prometheus exposition)."""

from datetime import datetime
from typing import Annotated

from pydantic import Field, StringConstraints

from .base import API_VERSION, DocumentModel, RequestModel

MetricKey = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class MetricPoint(RequestModel):
    """One log point of a training run (a line of ``$GPULAYER_METRICS_FILE``)."""

    step: int | None = Field(default=None, ge=0)
    epoch: int | None = Field(default=None, ge=0)
    rank: int | None = Field(default=None, ge=0)
    ts: datetime
    metrics: dict[MetricKey, float] = Field(max_length=1000)


class MetricBatch(RequestModel):
    """Points of one task; ``seq`` numbers the first point within the task so a
    batch sent twice is stored once (as :class:`LogBatch`)."""

    seq: int = Field(ge=0)
    points: list[MetricPoint] = Field(max_length=10000)


class MetricAck(DocumentModel):
    """How many of a task's metric points the control plane now holds."""

    next_seq: int


class StoredMetricPoint(DocumentModel):
    """A stored point; ``seq`` numbers a job's points from 1, in arrival order."""

    seq: int
    task_id: str | None = None
    step: int | None = None
    epoch: int | None = None
    rank: int | None = None
    ts: datetime
    metrics: dict[str, float]


class MetricPage(DocumentModel):
    """Points with ``seq`` greater than ``after``; ask again with ``after=next_after``."""

    api_version: str = API_VERSION
    points: list[StoredMetricPoint]
    next_after: int
    complete: bool = Field(description="the job ended and every point is stored")
