"""``RemoteFunction.map``: many calls in a few batched jobs, results as they come."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from gpulayer import contracts, errors, payload
from gpulayer.client.connection import Connection
from gpulayer.client.jobs import failure_of
from gpulayer.client.pending import NOTE_AFTER_SECONDS, why_queued
from gpulayer.functions.tracebacks import call_outcomes, exception
from gpulayer.notebook.progress import Bar

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Batched(Protocol[R_co]):
    """What a map needs of its :class:`~gpulayer.functions.decorator.RemoteFunction`:
    the function (for local tracebacks) and the job of one batch of calls."""

    @property
    def function(self) -> Callable[..., R_co]:
        """The wrapped function."""
        ...

    def spec_for(self, calls: list[payload.CallArgs], conn: Connection) -> contracts.JobSpec:
        """The job that makes ``calls``."""
        ...


_BATCH_JOBS = 500  # specs per POST jobs/batch
_BATCH_BYTES = 4 * 1024 * 1024
_WAIT_SECONDS = 30.0  # one wait for results, where nobody watches the bar


class MapRun(Generic[R]):
    """The iterator :meth:`RemoteFunction.map` answers; closing it cancels the rest."""

    def __init__(
        self,
        fn: Batched[R],
        conn: Connection,
        items: list[tuple[Any, ...]],
        chunks: list[list[int]],
        *,
        ordered: bool,
        return_exceptions: bool,
        max_parallel: int | None,
        progress: Bar,
    ) -> None:
        self._fn = fn
        self._conn = conn
        self._items = items
        self._chunks = chunks
        self._ordered = ordered
        self._return_exceptions = return_exceptions
        self._limit = max_parallel
        self._progress = progress
        # a bar someone watches says why calls wait: it asks every couple of seconds
        self._watched = not getattr(progress, "disable", True)
        self._why = ""
        self._next_chunk = 0
        self._pending: dict[str, int] = {}  # job id -> chunk index
        self._infos: dict[str, contracts.Job] = {}
        self._ready: dict[int, tuple[bool, Any]] = {}  # item index -> (ok, value or exception)
        self._order: list[int] = []  # item indexes in the order they finished
        self._delivered: set[int] = set()  # item indexes handed to the caller
        self._yielded = 0
        self._closed = False
        self._lock = threading.Lock()
        self._submit_more()

    def __iter__(self) -> MapRun[R]:
        return self

    def __enter__(self) -> MapRun[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and getattr(self, "_pending", None):
            self.close()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def job_ids(self) -> list[str]:
        """The jobs submitted so far (one per chunk)."""
        return list(self._infos)

    def __next__(self) -> R:
        if self._yielded >= len(self._items):
            self.close()
            raise StopIteration
        try:
            index = self._next_index()
        except BaseException:
            self.close()
            raise
        ok, value = self._ready.pop(index)
        self._delivered.add(index)
        self._yielded += 1
        if self._yielded >= len(self._items):
            self.close()
        if ok or self._return_exceptions:
            result: R = value
            return result
        self.close()
        raise value

    def close(self) -> None:
        """Cancel the calls that have not finished; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._progress.close()
        for job_id in list(self._pending):
            with contextlib.suppress(errors.InvalidTransition, errors.NotFound):
                self._conn.cancel(job_id, retry=True)  # through an outage too
        self._pending.clear()

    def _next_index(self) -> int:
        while True:
            if self._ordered:
                if self._yielded in self._ready:
                    return self._yielded
            elif self._order:
                return self._order.pop(0)
            self._collect()

    def _collect(self) -> None:
        """Wait until at least one more chunk ended; take its outcomes."""
        if not self._pending:
            raise RuntimeError("map: nothing is running, but results are missing")
        wait = NOTE_AFTER_SECONDS if self._watched else _WAIT_SECONDS
        ended = self._conn.wait_any(list(self._pending), timeout=wait)
        if self._watched and not ended:
            self._say_why_waiting()
        elif ended and self._why:  # calls moved on: the reason may be stale, ask anew
            self._why = ""
            self._progress.set_postfix_str("")
        for info in ended:
            if info.id not in self._pending:
                continue  # answered twice (a wait repeated after an outage): taken already
            chunk = self._chunks[self._pending.pop(info.id)]
            self._infos[info.id] = info
            failure: Exception
            try:  # a chunk whose worker died still hands over the calls it finished
                got = call_outcomes(self._conn, info, len(chunk))
            except errors.GpulayerError as e:
                got, failure = [], e
            else:
                failure = failure_of(info)
            for k, index in enumerate(chunk):
                if index in self._ready or index in self._delivered:
                    continue  # never two results for one item
                o = got[k] if k < len(got) else None
                if o is None:
                    entry: tuple[bool, Any] = (False, failure)
                elif o.ok:
                    entry = (True, o.value)
                else:
                    entry = (False, exception(o, info, self._fn.function))
                self._ready[index] = entry
                self._order.append(index)
            self._progress.update(len(chunk))
        self._submit_more()

    def _say_why_waiting(self) -> None:
        """Show after the count why calls still wait, from the newest unfinished job
        (the last to be placed): ``queued: local-1: all 2 task slots busy``, or
        ``cannot start: ...`` with what to do; nothing once it runs."""
        newest = next(reversed(self._pending))
        try:
            why = why_queued(self._conn.job(newest, retry=True)) or ""
        except errors.NotFound:  # deleted meanwhile: the wait says so
            return
        if why != self._why:
            self._why = why
            self._progress.set_postfix_str(why)

    def _submit_more(self) -> None:
        """Submit chunks up to ``max_parallel`` running, in batched requests."""
        room = len(self._chunks) - self._next_chunk
        if self._limit is not None:
            room = min(room, self._limit - len(self._pending))
        while room > 0 and not self._closed:
            specs: list[contracts.JobSpec] = []
            first, size = self._next_chunk, 0
            while room > 0 and len(specs) < _BATCH_JOBS and size < _BATCH_BYTES:
                chunk = self._chunks[self._next_chunk]
                spec = self._fn.spec_for([(self._items[i], {}) for i in chunk], self._conn)
                specs.append(spec)
                size += len(spec.function.payload or b"") if spec.function else 0
                self._next_chunk += 1
                room -= 1
            jobs = self._conn.submit_many(specs)
            for k, info in enumerate(jobs):
                self._pending[info.id] = first + k
                self._infos[info.id] = info
