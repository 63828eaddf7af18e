"""gpulayer tokens, roles, principals and the failed-login limiter.

Tokens are ``gl_`` plus 43 random URL-safe characters (so secret scanners can
find leaked ones), shown once and stored only as their SHA-256, and compared in
constant time. A request is made by a :class:`Principal`: either the holder of a
bearer token, or the Jupyter server's own authenticated user, who gets the role
``GpulayerApp.jupyter_user_role``.

Roles (``requires`` always admits ``admin``):

=============  ============================================================
``admin``      everything, including tokens
``submitter``  submit jobs and upload bundles; see, follow and cancel only its
               own jobs (owner = the token's name), their logs and artifacts
``viewer``     every read route, nothing that changes state
``join``       register new workers (reusable, or single-use, with expiry; a
               provider instance's is single-use and bound to its worker name)
``worker``     issued at registration; only its own worker and tasks
=============  ============================================================

A job with ``api_access`` gives its task a token of its own
(:meth:`TokenService.for_task`): named after the job's owner, role ``submitter``
whatever the owner's role, revoked in the transaction that ends the task.

Revocation is immediate: the next request with the token is 401, and a long
poll that is open when it is revoked (or expires) ends with 401 at once
(:meth:`TokenService.until_invalid`). Resolved tokens are cached for
``cache_seconds`` (0.5 s), so a request does not read the store each time
(docs/adr/0115): every change of a token row this process commits (a revoke, a
single use, a task's token ending) drops its entry at once, through the store's
change journal, an expiry is checked on every hit, and a change made by another
process is read at the latest ``cache_seconds`` later. :meth:`TokenService.on_revoked`
tells other parts (open channels) when a token is revoked or expires.

Failed logins are counted per client address (:class:`LoginLimiter`); over the
limit, further *bad* tokens from that address are answered 429 until the window
has passed, while a valid token is always served (many users, and the local
worker, may share one address).
"""

import asyncio
import functools
import hashlib
import hmac
import logging
import os
import secrets
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer.contracts import CreatedToken, CreateToken, Token, TokenState
from gpulayer.errors import AuthError, Conflict, Forbidden, NotFound, RateLimited

from .store import Statement, Store, TokenRecord, as_datetime, as_optional_datetime
from .store.writes import insert_token

log = logging.getLogger(__name__)

ROLES = ("admin", "submitter", "viewer", "join", "worker")
#: Roles an admin may mint; ``worker`` tokens come only from registration.
MINTABLE_ROLES = ("admin", "submitter", "viewer", "join")
TOKEN_PREFIX = "gl_"
#: Names of provider instances' join tokens: ``instance:<worker name>``.
INSTANCE_TOKEN_PREFIX = "instance:"
#: How long a resolved token is trusted without reading the store again (a change
#: made by another process is seen at the latest this much later).
CACHE_SECONDS = 0.5
#: Resolved tokens cached at most (the least recently used are forgotten).
CACHE_ENTRIES = 4096
#: Called with a token id when that token is revoked, used up or expires.
RevokedCallback = Callable[[str], None]


@dataclass(frozen=True)
class Principal:
    """Who is making a request."""

    name: str
    role: str
    token_id: str | None = None
    worker_id: str | None = None
    expires_at: float | None = None
    single_use: bool = False
    #: A provider instance's join token: the one worker name it registers.
    instance_worker: str | None = None


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


class LoginLimiter:
    """Failed logins per client address in a sliding window (in memory).

    Parameters
    ----------
    failures
        Failed attempts allowed from one address within ``window_seconds``; the
        next failed attempt is answered 429 rather than 401 until the oldest
        failure leaves the window. A valid token is never refused (the check
        runs only once a token turned out bad). ``0`` turns the limiter off.
    clock
        Monotonic seconds; tests inject their own.
    max_addresses
        Addresses remembered at most (the least recently failing are forgotten).
    """

    def __init__(
        self,
        failures: int = 10,
        window_seconds: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 10000,
    ) -> None:
        self.failures = failures
        self.window_seconds = window_seconds
        self.clock = clock
        self.max_addresses = max_addresses
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float]:
        times = self._seen.get(address, deque())
        horizon = self.clock() - self.window_seconds
        while times and times[0] <= horizon:
            times.popleft()
        return times

    def check(self, address: str) -> None:
        """Refuse an address that failed too often.

        Raises
        ------
        RateLimited
            With the seconds until the next attempt is accepted.
        """
        if self.failures <= 0:
            return
        times = self._recent(address)
        if len(times) >= self.failures:
            wait = max(1.0, times[0] + self.window_seconds - self.clock())
            raise RateLimited(
                f"too many failed logins from {address}; try again in {wait:.0f}s",
                retry_after_seconds=wait,
            )

    def failed(self, address: str) -> None:
        """Count one failed login from ``address``."""
        if self.failures <= 0:
            return
        times = self._recent(address)
        times.append(self.clock())
        self._seen[address] = times
        self._seen.move_to_end(address)
        while len(self._seen) > self.max_addresses:
            self._seen.popitem(last=False)


class TokenService:
    """Create, resolve, list and revoke tokens against the store."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float] = time.time,
        limiter: LoginLimiter | None = None,
        *,
        cache_seconds: float = CACHE_SECONDS,
    ) -> None:
        self.store = store
        self.clock = clock
        self.limiter = limiter or LoginLimiter(failures=0)
        self.cache_seconds = cache_seconds
        self._watchers: dict[str, set[asyncio.Future[str]]] = defaultdict(set)
        # token hash -> (principal, monotonic time read); token id -> hash
        self._cache: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._hashes: dict[str, str] = {}
        self._callbacks: list[RevokedCallback] = []
        self._expiries: dict[str, asyncio.TimerHandle] = {}
        self._why: dict[str, str] = {}
        store.on_token_change(self._changed)

    # ------------------------------------------------------------- minting

    async def create(
        self,
        name: str,
        role: str,
        *,
        worker_id: str | None = None,
        expires_at: float | None = None,
        single_use: bool = False,
    ) -> str:
        """Mint a token; returns the plaintext, which is not stored."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self.store.insert_token(
            TokenRecord(
                id=uuid.uuid4().hex[:12],
                name=name,
                role=role,
                hash=hash_token(token),
                created_at=self.clock(),
                expires_at=expires_at,
                revoked_at=None,
                worker_id=worker_id,
                single_use=single_use,
                used_at=None,
            )
        )
        return token

    def for_task(self, owner: str, task_id: str) -> tuple[str, Statement]:
        """A task's own token (a job with ``api_access``) and the statement that stores
        it, for the caller's transaction.

        It acts as the job's owner with the role ``submitter``, whatever the owner's
        role (an admin's job never gets admin rights), and ends with the task
        (``transitions.task_end`` revokes it).
        """
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = TokenRecord(
            id=uuid.uuid4().hex[:12],
            name=owner,
            role="submitter",
            hash=hash_token(token),
            created_at=self.clock(),
            expires_at=None,
            revoked_at=None,
            worker_id=None,
            single_use=False,
            used_at=None,
            task_id=task_id,
        )
        return token, insert_token(record)

    async def for_instance(self, instance_id: str, worker_name: str, expires_at: float) -> str:
        """A provider instance's join token: single-use, expiring, and good only for
        registering ``worker_name`` (``access.may_register``); it is named
        ``instance:<worker_name>`` and listed with its ``instance_id``."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self.store.insert_token(
            TokenRecord(
                id=uuid.uuid4().hex[:12],
                name=INSTANCE_TOKEN_PREFIX + worker_name,
                role="join",
                hash=hash_token(token),
                created_at=self.clock(),
                expires_at=expires_at,
                revoked_at=None,
                worker_id=None,
                single_use=True,
                used_at=None,
                instance_id=instance_id,
            )
        )
        return token

    async def revoke_instance(self, instance_id: str) -> None:
        """Revoke an instance's unused join tokens (it ended before joining)."""
        ids = [
            r.id
            for r in await self.store.list_tokens()
            if r.instance_id == instance_id and self._state(r) == "active"
        ]
        if ids:
            await self._revoke(ids, "its provider instance ended")

    async def mint(self, req: CreateToken) -> CreatedToken:
        """``POST tokens``: a named token; 409 while another active one has the name
        (tasks' own tokens, named after their owner, do not count)."""
        named = await self.store.tokens_named(req.name)
        if any(self._state(r) == "active" and r.task_id is None for r in named):
            raise Conflict(
                f"an active token named {req.name!r} exists; revoke it first", field="name"
            )
        expires_at = None if req.expires is None else self.clock() + req.expires
        token = await self.create(
            req.name, req.role, expires_at=expires_at, single_use=req.single_use
        )
        row = await self.store.token_by_hash(hash_token(token))
        assert row is not None
        return CreatedToken(**self._model(row).model_dump(), token=token)

    # ----------------------------------------------------------- resolving

    async def resolve(self, token: str, address: str | None = None) -> Principal:
        """The principal of a bearer token.

        Raises
        ------
        RateLimited
            For a bad token from an ``address`` that failed too often recently; a
            valid token is served whatever its address did.
        AuthError
            For an unknown, revoked, used or expired token (counted against ``address``).
        """
        try:
            return await self._resolve(token)
        except AuthError:
            if address is not None:
                self.limiter.check(address)
                self.limiter.failed(address)
            raise

    async def _resolve(self, token: str) -> Principal:
        digest = hash_token(token)
        cached = self._cache.get(digest)
        if cached is not None and time.monotonic() - cached[1] < self.cache_seconds:
            principal = cached[0]
            if principal.expires_at is not None and principal.expires_at <= self.clock():
                self._drop(principal.token_id)
                raise AuthError(f"token {principal.name!r} {_STATE_TEXT['expired']}")
            self._cache.move_to_end(digest)
            return principal
        row = await self.store.token_by_hash(digest)
        # The lookup is by hash; compare again in constant time all the same.
        if row is None or not hmac.compare_digest(row.hash, digest):
            raise AuthError("unknown gpulayer token")
        state = self._state(row)
        if state != "active":
            raise AuthError(f"token {row.name!r} {_STATE_TEXT[state]}")
        principal = Principal(
            name=row.name,
            role=row.role,
            token_id=row.id,
            worker_id=row.worker_id,
            expires_at=row.expires_at,
            single_use=row.single_use,
            instance_worker=_instance_worker(row),
        )
        if not row.single_use:  # a single-use token is read each time: its use ends it
            self._remember(digest, principal)
        return principal

    def _remember(self, digest: str, principal: Principal) -> None:
        """Cache a resolved token, and arm its expiry for :meth:`on_revoked`."""
        token_id = principal.token_id
        assert token_id is not None
        self._cache[digest] = (principal, time.monotonic())
        self._cache.move_to_end(digest)
        self._hashes[token_id] = digest
        while len(self._cache) > CACHE_ENTRIES:
            _, (old, _) = self._cache.popitem(last=False)
            self._hashes.pop(old.token_id or "", None)
        if principal.expires_at is not None and token_id not in self._expiries:
            delay = max(0.0, principal.expires_at - self.clock())
            loop = asyncio.get_running_loop()
            self._expiries[token_id] = loop.call_later(delay, self._expired, token_id)

    def _drop(self, token_id: str | None) -> None:
        """Forget the cached principal of ``token_id`` (read it again next time)."""
        digest = self._hashes.pop(token_id or "", None)
        if digest is not None:
            self._cache.pop(digest, None)

    def _expired(self, token_id: str) -> None:
        self._expiries.pop(token_id, None)
        self._ended(token_id, _STATE_TEXT["expired"])

    def _changed(self, changes: list[tuple[str, bool]]) -> None:
        """The store committed changes of these token rows (any process of ours)."""
        for token_id, ended in changes:
            self._drop(token_id)
            if ended:
                self._ended(token_id, self._why.pop(token_id, _STATE_TEXT["revoked"]))

    def _ended(self, token_id: str, why: str) -> None:
        """``token_id`` was revoked, used or expired: forget it, end its long polls
        and tell :meth:`on_revoked`'s callbacks."""
        self._drop(token_id)
        timer = self._expiries.pop(token_id, None)
        if timer is not None:
            timer.cancel()
        for fut in self._watchers.pop(token_id, ()):
            if not fut.done():
                fut.set_result(why)
        for callback in list(self._callbacks):
            try:
                callback(token_id)
            except Exception:  # one bad listener must not keep the others uninformed
                log.exception("on_revoked callback for token %s failed", token_id)

    def on_revoked(self, callback: RevokedCallback) -> Callable[[], None]:
        """Call ``callback(token_id)`` whenever a token is revoked (by this control
        plane: ``DELETE tokens``, a worker registering again, a task's token ending
        with its task), used up, or expires (one that was resolved here). Returns a
        function that stops the calls. Open channels of the token close on it."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    async def use(self, principal: Principal) -> None:
        """Consume a single-use token (a no-op for reusable ones).

        Raises
        ------
        AuthError
            When a concurrent request used it first.
        """
        if (
            principal.single_use
            and principal.token_id is not None
            and not await self.store.use_token(principal.token_id, self.clock())
        ):
            raise AuthError(f"token {principal.name!r} was already used")

    async def until_invalid(self, principal: Principal) -> str:
        """Wait until ``principal``'s token is revoked or expires; returns why.

        Waits forever for a principal without a token (the Jupyter user).
        """
        token_id = principal.token_id
        if token_id is None:
            await asyncio.Event().wait()
        assert token_id is not None
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._watchers[token_id].add(fut)
        try:
            # Registered first, then re-read: a revoke in between is not missed.
            row = await self.store.token_by_id(token_id)
            if row is None or self._state(row) != "active":
                return f"token {principal.name!r} is no longer valid"
            timeout = None
            if principal.expires_at is not None:
                timeout = max(0.0, principal.expires_at - self.clock())
            try:
                return f"token {principal.name!r} {await asyncio.wait_for(fut, timeout)}"
            except TimeoutError:
                return f"token {principal.name!r} has expired"
        finally:
            waiters = self._watchers.get(token_id)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._watchers[token_id]

    # ------------------------------------------------- listing and revoking

    async def records(self) -> list[Token]:
        """Every token record (never a secret), oldest first."""
        return [self._model(r) for r in await self.store.list_tokens()]

    async def revoke(self, name: str) -> list[Token]:
        """Revoke every active token named ``name``; open long polls of them end.

        Raises
        ------
        NotFound
            When no active token has that name.
        """
        rows = [r for r in await self.store.tokens_named(name) if self._state(r) == "active"]
        if not rows:
            raise NotFound(f"no active token named {name!r}")
        await self._revoke([r.id for r in rows], _STATE_TEXT["revoked"])
        return [self._model(r) for r in await self.store.tokens_named(name)]

    async def revoke_worker(self, worker_id: str) -> None:
        """Revoke a worker's session tokens (it registered again)."""
        ids = await self.store.worker_token_ids(worker_id)
        if ids:
            await self._revoke(ids, "was replaced: the worker registered again")

    async def _revoke(self, token_ids: list[str], why: str) -> None:
        """Revoke tokens; their cache entries, long polls and callbacks end as the
        store reports the change (:meth:`_changed`), with ``why``."""
        for token_id in token_ids:
            self._why[token_id] = why
        try:
            await self.store.revoke_tokens(token_ids, self.clock())
        finally:
            for token_id in token_ids:
                self._why.pop(token_id, None)

    # ------------------------------------------------------------ bootstrap

    async def bootstrap(self, data_dir: Path) -> None:
        """Make sure ``admin.token`` and ``join.token`` hold active tokens.

        The first start of a control plane mints both and writes them (mode 0600)
        for ``gpulayer up`` and the user to read; later starts keep them, and
        re-mint a file whose token the store does not know or no longer accepts
        (a replaced database, a revoked bootstrap token).
        """
        for filename, name, role in (
            ("admin.token", "admin", "admin"),
            ("join.token", "join", "join"),
        ):
            path = data_dir / filename
            if path.is_file():
                known = await self.store.token_by_hash(hash_token(path.read_text().strip()))
                if known is not None and self._state(known) == "active":
                    continue
            token = await self.create(name, role)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")

    # -------------------------------------------------------------- helpers

    def _state(self, row: TokenRecord) -> TokenState:
        if row.used_at is not None:
            return "used"
        if row.revoked_at is not None:
            return "revoked"
        if row.expires_at is not None and row.expires_at <= self.clock():
            return "expired"
        return "active"

    def _model(self, row: TokenRecord) -> Token:
        return Token(
            id=row.id,
            name=row.name,
            role=row.role,  # type: ignore[arg-type]  # roles are checked when minted
            state=self._state(row),
            created_at=as_datetime(row.created_at),
            expires_at=as_optional_datetime(row.expires_at),
            revoked_at=as_optional_datetime(row.revoked_at),
            single_use=row.single_use,
            worker_id=row.worker_id,
            task_id=row.task_id,
            instance_id=row.instance_id,
        )


def _instance_worker(row: TokenRecord) -> str | None:
    """The worker name an instance's join token registers (None for other tokens)."""
    if row.instance_id is None or not row.name.startswith(INSTANCE_TOKEN_PREFIX):
        return None
    return row.name[len(INSTANCE_TOKEN_PREFIX) :]


_STATE_TEXT = {"used": "was already used", "revoked": "was revoked", "expired": "has expired"}


def bearer_token(header: str | None) -> str | None:
    """The gpulayer token in an ``Authorization`` header, if any."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() in ("bearer", "token") and value.startswith(TOKEN_PREFIX):
        return value
    return None


def admit(principal: Principal | None, allowed: frozenset[str], method: str, path: str) -> None:
    """Refuse a request whose principal lacks every role in ``allowed``.

    Raises
    ------
    AuthError
        Without a principal.
    Forbidden
        For a principal of another role.
    """
    if principal is None:
        raise AuthError(
            "this route needs a gpulayer token (Authorization: Bearer gl_...)"
            " or a logged-in Jupyter user"
        )
    if principal.role not in allowed:
        raise Forbidden(f"role {principal.role!r} may not call {method} {path}")


def requires(
    *roles: str,
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Decorate a handler verb: the request's principal must have one of ``roles``.

    ``admin`` is always allowed. The handler's ``prepare`` has resolved
    ``self.principal`` (bearer token or Jupyter user) before the verb runs.
    """
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")
    allowed = frozenset(roles) | {"admin"}

    def decorator(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            admit(self.principal, allowed, self.request.method, self.request.path)
            return await method(self, *args, **kwargs)

        # a marker the auth-coverage test reads; functions take attributes at run time
        wrapper.__gpulayer_roles__ = allowed  # type: ignore[attr-defined]
        return wrapper

    return decorator
