"""Retention and garbage collection: what the control plane deletes, and when.

Nothing that has not ended is ever deleted: a queued, scheduled or running job,
its rows and the blobs it names stay, whatever the policy says. Otherwise:

- ``DELETE jobs/{id}`` deletes one finished job (its owner or an admin; 409 while
  it is active) with its tasks, events, logs, metrics, artifact and result rows;
- a collection (``POST gc``, ``gpulayer gc``, and every ``gc_interval_seconds``)
  applies the :class:`Policy`: finished jobs that ended more than
  ``max_age_seconds`` ago, those beyond the newest ``max_jobs`` finished ones, then
  the oldest finished ones while blobs take more than ``max_bytes`` (each limit off
  at 0, the default);
- a blob is deleted once no stored job names it (artifacts, results, bundles,
  payloads, pushed variables) and it was not stored, or stored again, within
  ``blob_grace_seconds`` (an upload waiting for its submit names no job yet). The
  blobs of jobs deleted now need only a minute of that (a re-upload for a submit
  in flight refreshes the blob's time).

See docs/storage.md.
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpulayer.contracts import GcReport, GcRequest
from gpulayer.errors import Conflict

from . import access
from .auth import Principal
from .core import Core

log = logging.getLogger("gpulayer.retention")

#: Jobs deleted per transaction (the one writer is free between batches).
BATCH = 200
#: The least time a blob of a job deleted now is kept after it was last stored.
IN_FLIGHT_SECONDS = 60.0
#: Half-written uploads (a crash, a dropped connection) are removed after this.
TMP_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class Policy:
    """What a collection deletes (each limit off at 0); see the module docstring."""

    max_age_seconds: float = 0.0
    max_jobs: int = 0
    max_bytes: int = 0
    blob_grace_seconds: float = 3600.0

    def updated(self, req: GcRequest | None) -> "Policy":
        """This policy with the limits a ``GcRequest`` gives instead."""
        if req is None:
            return self
        given = {k: v for k, v in req.model_dump().items() if v is not None}
        return replace(self, **given)


class Retention:
    """Deletes finished jobs and the blobs nothing names any more."""

    def __init__(self, core: Core, policy: Policy | None = None) -> None:
        self._core = core
        self.policy = policy or Policy()
        self._one_at_a_time = asyncio.Lock()

    async def delete(self, job_id: str, viewer: Principal | None = None) -> None:
        """Delete one finished job with its rows, and the blobs no other job names.

        Raises
        ------
        NotFound
            When there is no such job, or ``viewer`` may not see it.
        Conflict
            When the job has not ended (cancel it first).
        """
        store = self._core.store
        access.visible_job(viewer, await store.get_job(job_id), job_id)
        async with self._one_at_a_time:
            tally = _Tally()
            if not await self._delete_jobs([job_id], tally, self.policy):
                row = access.visible_job(viewer, await store.get_job(job_id), job_id)
                raise Conflict(
                    f"job {job_id} is {row.state}; only a finished job can be deleted"
                    " (cancel it first)"
                )
        who = viewer.name if viewer is not None else "the control plane"
        log.info("job %s deleted by %s (%d bytes of blobs freed)", job_id, who, tally.bytes)

    async def collect(self, req: GcRequest | None = None) -> GcReport:
        """Apply the policy (with ``req``'s limits instead, when given) now."""
        policy = self.policy.updated(req)
        async with self._one_at_a_time:
            tally = await self._collect(policy)
        blob_bytes = await asyncio.to_thread(self._core.blobs.total_bytes)
        if tally.jobs or tally.blobs:
            log.info(
                "garbage collection: %d job(s) and %d blob(s) deleted, %d bytes freed;"
                " blobs take %d bytes", tally.jobs, tally.blobs, tally.bytes, blob_bytes,
            )  # fmt: skip
        return GcReport(
            jobs_deleted=tally.jobs,
            blobs_deleted=tally.blobs,
            bytes_freed=tally.bytes,
            blob_bytes=blob_bytes,
        )

    async def _collect(self, policy: Policy) -> "_Tally":
        store, blobs, tally = self._core.store, self._core.blobs, _Tally()
        now = self._core.clock()
        if policy.max_age_seconds > 0:
            cutoff = now - policy.max_age_seconds
            while await self._delete_jobs(await store.ended_before(cutoff, BATCH), tally, policy):
                pass
        if policy.max_jobs > 0:
            while await self._delete_jobs(
                await store.ended_beyond(policy.max_jobs, BATCH), tally, policy
            ):
                pass
        if policy.max_bytes > 0:
            while await asyncio.to_thread(blobs.total_bytes) > policy.max_bytes:
                if not await self._delete_jobs(await store.oldest_ended(20), tally, policy):
                    break
        await self._delete_blobs(None, policy.blob_grace_seconds, tally)
        tally.bytes += await asyncio.to_thread(blobs.clean_tmp, TMP_SECONDS)
        return tally

    async def _delete_jobs(self, job_ids: Sequence[str], tally: "_Tally", policy: Policy) -> int:
        """Delete these jobs (those that ended) and then the blobs only they named;
        answers how many jobs were deleted."""
        if not job_ids:
            return 0
        store = self._core.store
        named = await store.blobs_of_jobs(job_ids)
        deleted = await store.delete_jobs(job_ids)
        for job_id in deleted:
            self._core.forget(job_id)
        tally.jobs += len(deleted)
        await self._delete_blobs(named, min(policy.blob_grace_seconds, IN_FLIGHT_SECONDS), tally)
        return len(deleted)

    async def _delete_blobs(self, among: set[str] | None, grace: float, tally: "_Tally") -> None:
        """Delete the blobs (``among`` these, or any) no job names, last stored more
        than ``grace`` seconds ago."""
        blobs = self._core.blobs
        if among is not None and not among:
            return
        named = await self._core.store.referenced_blobs()
        cutoff = time.time() - grace  # file times are wall-clock times
        entries = await asyncio.to_thread(blobs.entries, among)
        gone = []
        for entry in entries:
            if entry.sha256 in named or entry.mtime > cutoff:
                continue
            tally.bytes += await asyncio.to_thread(blobs.delete, entry.sha256)
            tally.blobs += 1
            gone.append(entry.sha256)
        if gone:
            await self._core.store.forget_blob_owners(gone)


@dataclass
class _Tally:
    jobs: int = 0
    blobs: int = 0
    bytes: int = 0
