"""Files a task produced, and uploaded blobs."""

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, StringConstraints

from .base import API_VERSION, DocumentModel, plain_text


def _relative_name(name: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("must be a relative path without '.', '..' or empty parts")
    return plain_text(name)


ArtifactName = Annotated[
    str, StringConstraints(min_length=1, max_length=512), AfterValidator(_relative_name)
]


class Artifact(DocumentModel):
    """A file a task produced, stored once by content."""

    name: str
    sha256: str
    size: int
    created_at: datetime


class ArtifactList(DocumentModel):
    """The artifacts of one job."""

    api_version: str = API_VERSION
    artifacts: list[Artifact]


class BlobRef(DocumentModel):
    """An uploaded blob (a source bundle, a large payload)."""

    sha256: str
    size: int
