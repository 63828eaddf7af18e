"""What the control plane keeps: garbage collection of finished jobs and blobs."""

from pydantic import ByteSize, Field

from .base import API_VERSION, DocumentModel, RequestModel


class GcRequest(RequestModel):
    """``POST gc``: collect now. A limit given here replaces the configured one for
    this run (``c.GpulayerApp.retention_*``); none given runs the configured policy."""

    max_age_seconds: float | None = Field(
        default=None, gt=0, description="delete finished jobs that ended longer ago than this"
    )
    max_jobs: int | None = Field(
        default=None, ge=0, description="keep at most this many finished jobs, newest first"
    )
    max_bytes: ByteSize | None = Field(
        default=None, ge=0, description="delete the oldest finished jobs while blobs take more"
    )


class GcReport(DocumentModel):
    """What a collection deleted, and what the blobs take now."""

    api_version: str = API_VERSION
    jobs_deleted: int = 0
    blobs_deleted: int = 0
    bytes_freed: int = 0
    blob_bytes: int = 0
