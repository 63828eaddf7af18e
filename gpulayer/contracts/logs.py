"""Job output: log lines as stored and read, as a worker ships them, and relayed kernel messages."""

import enum
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from .base import API_VERSION, DocumentModel, RequestModel


class LogStream(enum.StrEnum):
    """Where a log line came from; ``system`` lines are written by gpulayer itself."""

    stdout = "stdout"
    stderr = "stderr"
    system = "system"
    iopub = "iopub"  # a Jupyter message of a cell, as the JSON of a KernelMessage


class LogLine(DocumentModel):
    """One line of a job's output; ``offset`` numbers a job's lines from 0."""

    offset: int
    stream: LogStream
    ts: datetime
    text: str
    task_id: str | None = None
    rank: int | None = Field(default=None, description="distributed: the global rank that wrote it")


class LogPage(DocumentModel):
    """Lines from ``offset`` on. ``complete`` is true once the job ended and
    every line it will ever have is in the store."""

    api_version: str = API_VERSION
    lines: list[LogLine]
    next_offset: int
    complete: bool


class LogEntry(RequestModel):
    """One line as the worker ships it."""

    stream: LogStream
    ts: datetime
    text: Annotated[str, StringConstraints(max_length=65536)]
    rank: int | None = Field(default=None, ge=0, description="distributed: the global rank")


class LogBatch(RequestModel):
    """Lines of one task; ``seq`` numbers the first line within the task so a
    batch sent twice (after a lost answer) is stored once."""

    seq: int = Field(ge=0)
    lines: list[LogEntry] = Field(max_length=10000)


class LogAck(DocumentModel):
    """How many of a task's lines the control plane now holds."""

    next_seq: int


class KernelMessage(DocumentModel):
    """One relayed Jupyter iopub message: the text of a ``LogStream.iopub`` line.

    ``msg_type`` is one of ``stream``, ``display_data``, ``update_display_data``,
    ``execute_result``, ``error``, ``clear_output``, or gpulayer's own
    ``execute_reply`` (the cell is done; ``content`` is the kernel's reply).
    A message longer than a log line travels as several lines: each but the
    last starts with ``~`` (:data:`FRAGMENT`) and the client joins them.
    """

    msg_type: str
    # Any, not JsonValue: Jupyter's message bodies are free-form JSON, passed through
    # unchanged to IPython's display machinery; a recursive JSON type would make
    # every renderer narrow each value and cost a validation pass per output line.
    content: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    transient: dict[str, Any] = {}


FRAGMENT = "~"
"""Prefix of an ``iopub`` line that the next ``iopub`` line continues."""
