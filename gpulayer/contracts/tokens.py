"""Tokens and roles (who may call which route; see ``docs/security.md``)."""

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from .base import API_VERSION, DocumentModel, Name, OptionalDuration, RequestModel

#: ``admin`` everything; ``submitter`` its own jobs; ``viewer`` read-only;
#: ``join`` registers workers; ``worker`` is issued at registration only.
Role = Literal["admin", "submitter", "viewer", "join", "worker"]
TokenState = Literal["active", "expired", "revoked", "used"]


class CreateToken(RequestModel):
    """``POST tokens``: mint a named token (admin only)."""

    name: Name
    role: Literal["admin", "submitter", "viewer", "join"]
    expires: OptionalDuration = Field(default=None, description="lifetime: seconds or '30d', '12h'")
    single_use: bool = Field(default=False, description="join tokens only: one registration")

    @model_validator(mode="after")
    def _single_use_join(self) -> "CreateToken":
        if self.single_use and self.role != "join":
            raise ValueError("only join tokens can be single-use")
        return self


class Token(DocumentModel):
    """A token's record; the secret itself is never stored or listed."""

    id: str
    name: str
    role: Role
    state: TokenState
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    single_use: bool = False
    worker_id: str | None = None
    task_id: str | None = Field(
        default=None, description="a task's own token (api_access), revoked when it ends"
    )
    instance_id: str | None = Field(
        default=None, description="a provider instance's join token (its one worker name)"
    )


class CreatedToken(Token):
    """The answer to ``POST tokens``: the record plus the secret, shown this once."""

    token: str


class TokenList(DocumentModel):
    """``GET tokens``."""

    api_version: str = API_VERSION
    tokens: list[Token]
