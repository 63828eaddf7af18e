"""Secrets: values a job names (``secrets=["HF_TOKEN"]``) and gets in its environment.

A secret belongs to an owner; its value goes in once (``PUT secrets/{name}``) and
comes out only in the assignment of a task that names it, never in a read. See
``docs/secrets.md``.
"""

from datetime import datetime
from typing import Annotated, Final

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_serializer,
)

from .base import API_VERSION, DocumentModel, RequestModel

#: Shortest value a secret may hold: a shorter one would be masked in every line
#: where those few characters happen to appear (docs/secrets.md, "Masking").
MIN_SECRET_CHARS: Final = 4
#: Longest value (characters), enough for a PEM key or a service-account JSON file.
MAX_SECRET_CHARS: Final = 64 * 1024

#: A secret's name: the environment variable the task gets it in.
SecretName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
]


def _settable(value: SecretStr) -> SecretStr:
    text = value.get_secret_value()
    if len(text) < MIN_SECRET_CHARS:
        raise ValueError(
            f"a secret holds at least {MIN_SECRET_CHARS} characters (a shorter one could"
            " not be masked in the job's output)"
        )
    if len(text) > MAX_SECRET_CHARS:
        raise ValueError(f"a secret holds at most {MAX_SECRET_CHARS} characters")
    if "\x00" in text:
        raise ValueError("a secret cannot hold a NUL character (no environment variable can)")
    if not text.strip():
        raise ValueError("a secret cannot be only whitespace")
    return value


def secret_names(names: list[str]) -> list[str]:
    """``names`` when each appears once (a field validator of ``secrets`` lists)."""
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"secret {n!r} is named twice")
        if n.startswith("GPULAYER_"):
            raise ValueError(f"{n!r}: names starting with GPULAYER_ are gpulayer's own")
        seen.add(n)
    return names


#: The ``secrets`` field of a job or session: names, each once.
SecretNames = Annotated[list[SecretName], AfterValidator(secret_names)]


class SetSecret(RequestModel):
    """``PUT secrets/{name}``: the value (replacing any earlier one for tasks that
    start from now on). ``repr`` never shows it; JSON carries it (the wire needs it)."""

    # A refused value is never echoed in an error (pydantic shows inputs by default).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    value: Annotated[SecretStr, AfterValidator(_settable)]

    @field_serializer("value", when_used="json")
    def _reveal(self, value: SecretStr) -> str:
        return value.get_secret_value()


class Secret(DocumentModel):
    """A secret's record: never its value."""

    name: str
    owner: str
    created_at: datetime
    updated_at: datetime
    shared_with: list[str] = Field(
        default=[], description="other owners whose jobs may name it (an admin shares it)"
    )


class SecretList(DocumentModel):
    """``GET secrets``: the caller's own and those shared with it (an admin and a
    viewer: every owner's)."""

    api_version: str = API_VERSION
    secrets: list[Secret]
