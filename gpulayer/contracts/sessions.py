"""Sessions: persistent kernels that hold a worker slot and its GPUs."""

from datetime import datetime
from typing import Literal

from pydantic import Field

from .base import (
    API_VERSION,
    DocumentModel,
    EnvName,
    LabelKey,
    LabelValue,
    Name,
    OptionalDuration,
    RequestModel,
)
from .environments import EnvSpec
from .jobs import JobState
from .resources import Resources
from .secrets import SecretNames


class CreateSession(RequestModel):
    """``POST sessions``: start a persistent kernel on a worker that fits."""

    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    name: Name
    resources: Resources = Field(
        default_factory=Resources, description="what each task needs; default: 1 CPU, no GPU"
    )
    idle_timeout: OptionalDuration = Field(default=None, description="seconds or '30m'")
    env: dict[EnvName, str] = {}
    labels: dict[LabelKey, LabelValue] = {}
    api_access: bool = Field(
        default=False,
        description="the kernel may call gpulayer: a token of the owner (submitter at most)"
        " for as long as the session runs",
    )
    secrets: SecretNames = Field(
        default=[], max_length=64, description="the owner's secrets the kernel gets in its env"
    )
    environment: EnvSpec | None = Field(
        default=None, description="the Python env its kernel (and so every cell) runs in"
    )


class Session(DocumentModel):
    """A session as users see it: its job, where its kernel runs, when it expires."""

    api_version: str = API_VERSION
    name: str
    job_id: str
    state: JobState
    reason: str | None = None
    owner: str
    worker_name: str | None = None
    gpu_indices: list[int] = []
    idle_timeout: float
    created_at: datetime
    started_at: datetime | None = None
    last_activity: datetime | None = Field(default=None, description="when the last cell ended")
    cells: int = Field(default=0, description="cells run in it so far")
    secrets: list[str] = Field(default=[], description="the secrets its kernel has (names)")


class SessionList(DocumentModel):
    """The sessions that have not ended, oldest first."""

    api_version: str = API_VERSION
    sessions: list[Session]
