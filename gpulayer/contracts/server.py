"""The control plane itself: health, and the body of every error answer."""

from typing import Literal

from .base import API_VERSION, DocumentModel


class Health(DocumentModel):
    """The control plane is up."""

    api_version: str = API_VERSION
    status: Literal["ok"] = "ok"
    version: str
    workers_ready: int = 0
    jobs_active: int = 0


class ErrorBody(DocumentModel):
    """The JSON body of every 4xx/5xx answer."""

    code: str
    message: str
    field: str | None = None
