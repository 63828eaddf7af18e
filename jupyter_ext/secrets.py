"""The secret service: set, list, delete and share secrets; hand their values to
tasks; mask them in what tasks report.

A secret is ``(owner, name)``; its value is sealed at rest (``sealing.py``) and
leaves the control plane only in the assignment of a task whose job names it
(``JobSpec.secrets``). Which secret a job's name means: the owner's own, else
one an admin shared with the owner (the first by owner name if several were).

Every value handed to a job's tasks is remembered for that job (in memory), and
the task intake masks them, and the current values of the secrets the job names,
in log lines and reasons before anything is stored or sent (``masking.py``). A
restart forgets what was handed: a value replaced while the job ran is then no
longer masked in its output (docs/secrets.md).
"""

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import TypeVar

from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from gpulayer.contracts import DEFERRED, JobSpec, Secret, SecretName, SetSecret
from gpulayer.errors import NotFound, StorageError, ValidationError

from .auth import Principal
from .core import Core
from .masking import Masker
from .sealing import Sealer
from .sessions import Sessions
from .store import JobRecord, SecretRecord

log = logging.getLogger(__name__)

T = TypeVar("T")
_NAME: TypeAdapter[str] = TypeAdapter(SecretName, config=DEFERRED)  # built at first use
#: Jobs whose masks are kept in memory (the least recently used are read again).
_MASKS_KEPT = 4096


def secret_name(name: str) -> str:
    """``name`` if it can name a secret (an environment variable's name).

    Raises
    ------
    ValidationError
        Naming the field ``name``.
    """
    try:
        _NAME.validate_python(name)
    except PydanticValidationError as e:
        raise ValidationError(
            f"{name[:128]!r} cannot name a secret: it becomes an environment variable"
            " (letters, digits and _, not starting with a digit; at most 128)",
            field="name",
        ) from e
    if name.startswith("GPULAYER_"):
        raise ValidationError("names starting with GPULAYER_ are gpulayer's own", field="name")
    return name


class Secrets:
    """Owners' secrets; see the module docstring."""

    def __init__(self, core: Core, sessions: Sessions, sealer: Sealer) -> None:
        self._core = core
        self._sessions = sessions
        self._sealer = sealer
        # Values handed to each job's tasks, and the maskers made from them and the
        # current values (dropped whenever a secret changes: they are made again).
        self._handed: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._masks: OrderedDict[str, Masker] = OrderedDict()

    # ------------------------------------------------------------ the routes

    async def set(self, name: str, req: SetSecret, who: Principal) -> Secret:
        """Store ``who``'s secret ``name`` (a new value replaces the old one for the
        tasks that start from now on; its shares stay)."""
        secret_name(name)
        sealed = await self._sealer.seal(who.name, name, req.value.get_secret_value())
        await self._core.store.put_secret(who.name, name, sealed, self._core.clock())
        self._masks.clear()
        log.info("secret %s of %s set", name, who.name)
        return await self._record(who.name, name)

    async def records(self, viewer: Principal | None) -> list[Secret]:
        """The secrets ``viewer`` may list: a submitter its own and those shared with
        it; an admin or a viewer every owner's (never a value)."""
        rows = await self._core.store.list_secrets()
        if viewer is not None and viewer.role == "submitter":
            rows = [r for r in rows if viewer.name in (r.owner, *r.shared_with)]
        return [r.model() for r in rows]

    async def delete(self, name: str, who: Principal, owner: str | None = None) -> None:
        """Forget a secret: ``who``'s own, or (an admin) ``owner``'s. Jobs that name
        it and start later get a ``system`` line saying it is gone."""
        row = await self._owned(name, who, owner)
        await self._core.store.delete_secret(row.owner, row.name)
        self._masks.clear()
        log.info("secret %s of %s deleted", row.name, row.owner)

    async def share(
        self, name: str, grantee: str, who: Principal, owner: str | None = None, *, on: bool = True
    ) -> Secret:
        """Let ``grantee``'s jobs name ``owner``'s secret (default: ``who``'s own), or
        stop that (``on=False``); only an admin calls this."""
        row = await self._owned(name, who, owner)
        shared = set(row.shared_with)
        if on:
            shared.add(grantee)
        else:
            shared.discard(grantee)
        shared.discard(row.owner)
        await self._core.store.share_secret(row.owner, row.name, sorted(shared))
        self._masks.clear()
        log.info("secret %s of %s shared with %s", row.name, row.owner, sorted(shared) or "nobody")
        return await self._record(row.owner, row.name)

    async def _owned(self, name: str, who: Principal, owner: str | None) -> SecretRecord:
        """``owner``'s secret ``name``: a submitter names only its own (404 otherwise)."""
        if owner is not None and owner != who.name and who.role != "admin":
            raise NotFound(f"no secret named {name!r}")
        row = await self._core.store.secret(owner or who.name, name)
        if row is None:
            raise NotFound(f"no secret named {name!r}" + (f" of {owner!r}" if owner else ""))
        return row

    async def _record(self, owner: str, name: str) -> Secret:
        row = await self._core.store.secret(owner, name)
        if row is None:
            raise NotFound(f"no secret named {name!r}")
        return row.model()

    # ---------------------------------------------------------------- jobs

    async def check(self, specs: Sequence[JobSpec], owner: str) -> None:
        """Refuse specs that name a secret ``owner`` has no use of.

        Raises
        ------
        ValidationError
            Naming the first missing secret (field ``secrets``).
        """
        for spec in specs:
            if spec.secrets and spec.in_session:
                raise ValidationError(
                    "a cell in a session has the session's secrets; name them when the"
                    " session starts",
                    field="secrets",
                )
        names = sorted({n for s in specs for n in s.secrets})
        found = await self._usable(owner, names)
        if missing := [n for n in names if n not in found]:
            raise ValidationError(
                f"no secret named {missing[0]!r} for {owner!r}; set it first with"
                f" `gpulayer secret set {missing[0]}`",
                field="secrets",
            )

    async def _usable(self, owner: str, names: Sequence[str]) -> dict[str, SecretRecord]:
        """The secret each of ``names`` means for ``owner``'s jobs (missing: left out)."""
        rows = await self._core.store.secrets_named(names)  # by owner, then name
        out = {r.name: r for r in rows if r.owner == owner}
        for r in rows:
            if owner in r.shared_with:
                out.setdefault(r.name, r)
        return out

    async def for_task(self, job: JobRecord, spec: JobSpec) -> tuple[dict[str, str], list[str]]:
        """The values a task of ``job`` gets, and a line for each secret it does not
        get (deleted, or sealed under another key); the values are remembered for
        masking the job's output. A cell in a session gets none: its kernel has the
        session's."""
        if not spec.secrets or spec.in_session:
            return {}, []
        rows = await self._usable(job.owner, spec.secrets)
        values: dict[str, str] = {}
        notes = []
        for name in spec.secrets:
            if name not in rows:
                notes.append(f"gpulayer: secret {name} no longer exists; this task starts"
                             " without it")  # fmt: skip
                continue
            try:
                values[name] = await self._sealer.open(rows[name].owner, name, rows[name].sealed)
            except StorageError as e:  # one unreadable secret must not stall the worker
                log.warning("job %s: %s", job.id, e.message)
                notes.append(f"gpulayer: {e.message}; this task starts without it")
        _keep(self._handed, job.id, self._handed.get(job.id, frozenset()) | set(values.values()))
        self._masks.pop(job.id, None)
        return values, notes

    async def masker(self, job_id: str, job: JobRecord | None = None) -> Masker:
        """What masks the output of ``job_id``: the values handed to its tasks and the
        current values of the secrets it names (for a cell in a session, the
        session's). ``job``: its row, when the caller has read it already."""
        found = self._masks.get(job_id)
        if found is not None:
            self._masks.move_to_end(job_id)
            return found
        if job is None:
            job = await self._core.store.get_job(job_id)
        if job is None:
            return Masker()
        spec = self._core.spec(job)
        values = set(self._handed.get(job_id, ()))
        if spec.secrets and not spec.in_session:
            for r in (await self._usable(job.owner, spec.secrets)).values():
                with contextlib.suppress(StorageError):  # said when its task started
                    values.add(await self._sealer.open(r.owner, r.name, r.sealed))
        if spec.in_session:
            session_id = self._sessions.submitted_to(job_id)  # known since its submit
            if session_id is None:
                session = await self._sessions.session_of(job_id, (job.owner, spec.in_session))
                session_id = None if session is None else session.id
            if session_id is not None:
                values |= (await self.masker(session_id)).values
        made = Masker(values)
        _keep(self._masks, job_id, made)
        return made


def _keep(kept: "OrderedDict[str, T]", job_id: str, value: T) -> None:
    """Keep ``value`` for ``job_id``, forgetting the least recently used beyond the cap."""
    kept[job_id] = value
    kept.move_to_end(job_id)
    while len(kept) > _MASKS_KEPT:
        kept.popitem(last=False)
