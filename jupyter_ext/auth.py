"""gpulayer tokens and principals.

Tokens are ``gl_`` plus 43 random URL-safe characters (so secret scanners can
find leaked ones), shown once and stored only as their SHA-256. A request is
made by a :class:`Principal`: either the holder of a bearer token, or the
Jupyter server's own authenticated user, who gets the role
``GpulayerApp.jupyter_user_role``.

Roles: ``admin`` may do everything; ``join`` may only register workers;
``worker`` may only call the worker routes for itself. (Scoped ``submitter`` and
``viewer`` roles come with the security work.)
"""

import functools
import hashlib
import hmac
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer.errors import AuthError, Forbidden

from .store import Store

ROLES = ("admin", "join", "worker")
TOKEN_PREFIX = "gl_"


@dataclass(frozen=True)
class Principal:
    """Who is making a request."""

    name: str
    role: str
    token_id: str | None = None
    worker_id: str | None = None


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenService:
    """Create and resolve tokens against the store."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def create(
        self,
        name: str,
        role: str,
        *,
        worker_id: str | None = None,
        expires_at: float | None = None,
    ) -> str:
        """Mint a token; returns the plaintext, which is not stored."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self.store.insert_token(
            {
                "id": uuid.uuid4().hex[:12],
                "name": name,
                "role": role,
                "hash": hash_token(token),
                "created_at": self.clock(),
                "expires_at": expires_at,
                "revoked_at": None,
                "worker_id": worker_id,
            }
        )
        return token

    async def resolve(self, token: str) -> Principal:
        """The principal of a bearer token.

        Raises
        ------
        AuthError
            For an unknown, revoked or expired token.
        """
        digest = hash_token(token)
        row = await self.store.token_by_hash(digest)
        # The lookup is by hash; compare again in constant time all the same.
        if row is None or not hmac.compare_digest(row["hash"], digest):
            raise AuthError("unknown gpulayer token")
        if row["revoked_at"] is not None:
            raise AuthError(f"token {row['name']!r} was revoked")
        if row["expires_at"] is not None and row["expires_at"] <= self.clock():
            raise AuthError(f"token {row['name']!r} has expired")
        return Principal(
            name=row["name"], role=row["role"], token_id=row["id"], worker_id=row["worker_id"]
        )

    async def bootstrap(self, data_dir: Path) -> None:
        """Make sure ``admin.token`` and ``join.token`` exist in the data dir.

        The first start of a control plane mints both and writes them (mode 0600)
        for ``gpulayer up`` and the user to read; later starts keep them, and
        re-mint a file whose token the store does not know (a replaced database).
        """
        for filename, name, role in (
            ("admin.token", "admin", "admin"),
            ("join.token", "join", "join"),
        ):
            path = data_dir / filename
            if path.is_file():
                known = await self.store.token_by_hash(hash_token(path.read_text().strip()))
                if known is not None:
                    continue
            token = await self.create(name, role)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")


def bearer_token(header: str | None) -> str | None:
    """The gpulayer token in an ``Authorization`` header, if any."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() in ("bearer", "token") and value.startswith(TOKEN_PREFIX):
        return value
    return None


def requires(
    *roles: str,
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Decorate a handler verb: the request's principal must have one of ``roles``.

    ``admin`` is always allowed. The handler's ``prepare`` has resolved
    ``self.principal`` (bearer token or Jupyter user) before the verb runs.
    """
    allowed = frozenset(roles) | {"admin"}

    def decorator(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            principal: Principal | None = self.principal
            if principal is None:
                raise AuthError(
                    "this route needs a gpulayer token (Authorization: Bearer gl_...)"
                    " or a logged-in Jupyter user"
                )
            if principal.role not in allowed:
                raise Forbidden(
                    f"role {principal.role!r} may not call {self.request.method}"
                    f" {self.request.path}"
                )
            return await method(self, *args, **kwargs)

        wrapper.__gpulayer_roles__ = allowed  # type: ignore[attr-defined]
        return wrapper

    return decorator
