"""Environments: the Python packages a job runs with (docs/environments.md).

A job's :class:`EnvSpec` names requirements (``pip``), where to find them
(``index_url``, ``extra_index_urls``, ``find_links``, wheels shipped with the
job) and whether the env sees the worker's own packages (``isolated``). The
worker builds it once per :attr:`EnvSpec.digest` and reports what it built as a
:class:`TaskEnvironment` (``POST tasks/{id}/environment``); its heartbeats list
the envs it keeps as :class:`CachedEnv`.
"""

import hashlib
import json
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator

from .base import RequestModel, Sha256, plain_text

#: Most requirements one env may list (a requirements file of a large project fits).
MAX_REQUIREMENTS = 1000
#: Most cached envs a heartbeat lists (the newest used first).
MAX_REPORTED_ENVS = 32


def requirement(value: str) -> str:
    """``value`` as one normalized PEP 508 requirement (``Six >= 1.0`` -> ``Six>=1.0``).

    Raises
    ------
    ValueError
        If it is not a requirement (an option such as ``--index-url`` is not one:
        index options have fields of their own).
    """
    plain_text(value)
    text = value.strip()
    if text.startswith("-"):
        raise ValueError(
            f"{text!r} is an installer option, not a requirement: use index_url,"
            " extra_index_urls or find_links"
        )
    # Imported here: a job with an environment is rare, and packaging's parser costs
    # every process ~25 ms at import (ADR 0141).
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        why = str(e).splitlines()[0]
        raise ValueError(f"{text!r} is not a requirement: {why}") from None
    req.name = canonicalize_name(req.name)
    return str(req)


def _location(value: str) -> str:
    plain_text(value)
    if value.startswith(("http://", "https://", "file://", "/")) and " " not in value:
        return value
    raise ValueError("must be an http(s):// or file:// URL, or an absolute path on the worker")


Requirement = Annotated[
    str, StringConstraints(min_length=1, max_length=2048), AfterValidator(requirement)
]
#: An index or find-links location: a URL, or an absolute path on the worker.
Location = Annotated[
    str, StringConstraints(min_length=1, max_length=2048), AfterValidator(_location)
]
WheelName = Annotated[
    str, StringConstraints(max_length=255, pattern=r"^[A-Za-z0-9_.+!-]+-[^/]+\.whl$")
]
PythonVersion = Annotated[str, StringConstraints(pattern=r"^3\.\d{1,2}$")]


class Wheel(RequestModel):
    """A wheel shipped with the job (uploaded to ``blobs``), installed into its env."""

    filename: WheelName
    sha256: Sha256


class EnvSpec(RequestModel):
    """The Python environment a job runs in, built on the worker (with uv) and cached.

    By default the env is *layered*: a virtual env whose own packages come first,
    with the worker's site-packages visible behind them (the worker's torch stays
    importable); ``isolated`` gives a clean one. Requirements are normalized
    (PEP 508) and deduplicated, so equal envs have equal :attr:`digest`.
    """

    pip: list[Requirement] = Field(
        default=[], max_length=MAX_REQUIREMENTS, description="requirements, PEP 508 strings"
    )
    index_url: Location | None = Field(
        default=None, description="the package index (default: the worker's pip configuration)"
    )
    extra_index_urls: list[Location] = Field(default=[], max_length=16)
    find_links: list[Location] = Field(
        default=[], max_length=16, description="folders or pages of wheels, on the worker"
    )
    wheels: list[Wheel] = Field(
        default=[], max_length=64, description="wheels shipped with the job (local packages)"
    )
    isolated: bool = Field(default=False, description="a clean env: no worker packages visible")
    python: PythonVersion | None = Field(
        default=None,
        description="major.minor of the env's interpreter (default: the worker's)",
    )

    @field_validator("pip")
    @classmethod
    def _dedupe(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @property
    def empty(self) -> bool:
        """True when the env adds nothing to the worker's own (no packages, not isolated)."""
        return not (self.pip or self.wheels or self.isolated or self.python)

    @property
    def digest(self) -> str:
        """sha256 of the normalized spec (requirements sorted): equal for equal envs."""
        body = self.model_dump(mode="json")
        body["pip"] = sorted(body["pip"])
        body["wheels"] = sorted(w["sha256"] for w in body["wheels"])
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


EnvPhase = Literal["preparing", "ready", "failed"]


class TaskEnvironment(RequestModel):
    """What a worker reports about a task's env: ``preparing`` when its build (or the
    wait for another task's build of it) starts, then ``ready`` with the exact
    versions in it, or ``failed`` with the installer's message."""

    phase: EnvPhase
    key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,64}$")] = Field(
        description="the cache key: requirements, interpreter and base environment"
    )
    cached: bool = Field(default=False, description="ready without building (a cache hit)")
    python: Annotated[str, StringConstraints(max_length=32)] = ""
    packages: list[Annotated[str, StringConstraints(max_length=512)]] = Field(
        default=[],
        max_length=10_000,
        description="the env's own packages, exactly (name==version, as uv pip freeze)",
    )
    from_worker: list[Annotated[str, StringConstraints(max_length=512)]] = Field(
        default=[],
        max_length=MAX_REQUIREMENTS,
        description="requirements the worker's own packages satisfied (layered envs)",
    )
    started_at: datetime
    ended_at: datetime | None = None
    error: Annotated[str, StringConstraints(max_length=8192)] | None = None

    @property
    def build_seconds(self) -> float | None:
        """How long preparing took (None while it goes on)."""
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


class CachedEnv(RequestModel):
    """One env a worker keeps in its cache (its heartbeat lists them)."""

    key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,64}$")]
    size_bytes: int = Field(ge=0)
    last_used_at: datetime
    in_use: int = Field(default=0, ge=0, description="tasks and runners using it now")
    packages: int = Field(default=0, ge=0, description="how many packages it holds")
    python: Annotated[str, StringConstraints(max_length=32)] = ""
