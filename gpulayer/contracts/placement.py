"""Why a job runs where it does, or why it waits."""

from pydantic import Field

from .base import API_VERSION, DocumentModel
from .jobs import JobState


class WorkerFit(DocumentModel):
    """Whether a job fits one worker now, and if not, why."""

    worker: str
    fits: bool
    could_ever_fit: bool
    reason: str


class Placement(DocumentModel):
    """Why a job runs where it does, or why it waits (``GET jobs/{id}/placement``)."""

    api_version: str = API_VERSION
    job_id: str
    state: JobState
    satisfiable: bool = Field(description="some registered worker could ever run it")
    summary: str
    workers: list[WorkerFit] = []
