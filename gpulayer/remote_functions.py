"""Remote functions: ``@gl.remote`` runs a Python function on a worker.

>>> import gpulayer as gl
>>> @gl.remote(gpus=1, timeout="10m")
... def train(lr):
...     return fit(lr)
>>> train.run(0.1)                           # blocks, returns the value, prints live
>>> call = train.spawn(0.1); call.result()   # a handle
>>> list(train.map([0.1, 0.01, 0.001]))      # many calls, batched

>>> @gl.remote(nodes=2, nproc_per_node=2, gpus=2)  # a gang: every rank makes the call
... def fit_ddp(epochs):
...     return Trainer(max_epochs=epochs).fit(Model(), loader()).callback_metrics

A call travels as a :mod:`gpulayer.payload` (cloudpickle; the user's own modules
by value) in a ``function`` job; a worker makes it in a warm runner process
(:mod:`gpulayer.worker.functions`) and sends the outcome back. A remote
exception is raised here as its own type with the remote traceback as its
``__cause__``; one whose class does not exist here is a
:class:`~gpulayer.errors.RemoteError`. With ``nodes``/``nproc_per_node`` a call is
a ``distributed`` job instead: each rank runs it in a fresh process
(:mod:`gpulayer.worker.rank_call`) and global rank 0's outcome is the answer.

(The module is not called ``remote``: a submodule of that name would replace
the ``gl.remote`` decorator on the package once imported; docs/adr/0012.)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import math
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, ParamSpec, TypeVar

from pydantic import ValidationError as PydanticValidationError

from gpulayer import contracts, errors, payload
from gpulayer.client import (
    Connection,
    _resources,
    current_connection,
    pydantic_to_gpulayer,
)
from gpulayer.jobs import Job, failure_of
from gpulayer.progress import Progress

P = ParamSpec("P")
R = TypeVar("R")

_QUICK_WAIT_SECONDS = 0.5  # a .run() answer waits this long before following logs
_BATCH_JOBS = 500  # specs per POST jobs/batch
_BATCH_BYTES = 4 * 1024 * 1024
_CHUNKS_PER_SLOT = 4  # map: chunks per parallel slot, for load balance
_MAX_CHUNK = 512
_WORKERS_TTL_SECONDS = 30.0

_OPTIONS = frozenset(
    {
        "gpus",
        "cpus",
        "memory",
        "gpu_memory",
        "gpu_model",
        "accelerator",
        "min_compute_capability",
        "gpu_memory_kind",
        "selector",
        "worker",
        "profile",
        "timeout",
        "retries",
        "retry_exceptions",
        "name",
        "env",
        "labels",
        "priority",
        "connection",
        "nodes",
        "nproc_per_node",
        "launcher",
    }
)
_DISTRIBUTED = frozenset({"nodes", "nproc_per_node", "launcher"})


# ----------------------------------------------------------------- decorator


def remote(fn: Callable[P, R] | None = None, /, **options: Any) -> Any:
    """Make ``fn`` a :class:`RemoteFunction`: ``@gl.remote`` or ``@gl.remote(gpus=1, ...)``.

    Parameters
    ----------
    gpus, cpus, memory, gpu_memory, gpu_model, accelerator, min_compute_capability,
    gpu_memory_kind, selector, worker, profile
        What each call needs, as for :func:`gpulayer.submit`.
    timeout
        Per call: seconds or a string like ``"10m"``; the call is ``timed_out``
        (its runner killed) after it.
    retries
        Extra attempts after the runner crashed or its worker was lost.
    retry_exceptions
        Also retry when the function raises (default: an exception is the answer).
    name, env, labels, priority
        Of each call's job; ``name`` defaults to the function's name.
    nodes, nproc_per_node, launcher
        Make each call a distributed job: a gang of ``nodes`` workers (the
        resources are per node) with ``nproc_per_node`` processes each, placed all
        at once. Every rank makes the call with ``RANK``, ``WORLD_SIZE``,
        ``MASTER_ADDR`` and ``MASTER_PORT`` set (what
        ``torch.distributed.init_process_group`` and :class:`gpulayer.pytorch.Trainer`
        read); the answer is global rank 0's return value, or the first exception a
        rank raised. ``launcher`` is ``"torchrun"`` (default) or ``"direct"``.
        Each call runs in fresh processes, not a warm runner.
    connection
        Defaults to :func:`gpulayer.current_connection` at call time.

    Raises
    ------
    TypeError
        For an unknown option.
    """
    unknown = set(options) - _OPTIONS
    if unknown:
        raise TypeError(
            f"unknown option {sorted(unknown)[0]!r} for gl.remote;"
            f" known: {', '.join(sorted(_OPTIONS))}"
        )
    if fn is None:
        return lambda f: RemoteFunction(f, options)
    if not callable(fn):
        raise TypeError(f"gl.remote wraps a function, not a {type(fn).__name__}")
    return RemoteFunction(fn, options)


class RemoteFunction(Generic[P, R]):
    """A function that runs on a worker; made by :func:`remote`.

    Calling it directly runs it *here* (handy for a quick local check);
    :meth:`run`, :meth:`spawn` and :meth:`map` run it remotely. It keeps the
    wrapped function's name, docstring and signature.
    """

    def __init__(self, fn: Callable[P, R], options: Mapping[str, Any]) -> None:
        self._fn = fn
        self._options = dict(options)
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self._spec = self._base_spec()  # malformed options fail at decoration time

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items() if k != "connection")
        return f"<RemoteFunction {getattr(self._fn, '__qualname__', self._fn)}({opts})>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function locally, in this process."""
        return self._fn(*args, **kwargs)

    def options(self, **overrides: Any) -> RemoteFunction[P, R]:
        """A copy with some options changed, e.g. ``train.options(gpus=2).run(...)``."""
        unknown = set(overrides) - _OPTIONS
        if unknown:
            raise TypeError(f"unknown option {sorted(unknown)[0]!r} for gl.remote")
        return RemoteFunction(self._fn, {**self._options, **overrides})

    # ------------------------------------------------------------ calling

    def run(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call remotely and wait: the value, or the remote exception raised here.

        What the function prints appears here as it runs. Interrupting (Ctrl-C,
        the notebook's stop button) cancels the call.
        """
        conn = self._conn()
        spec = self._spec_for([(args, kwargs)], conn)
        info = conn.submit(spec, wait=_QUICK_WAIT_SECONDS)
        call = Call(conn, info, self._name(), self._fn)
        try:
            if info.state.terminal:
                if info.log_lines:
                    call._echo(0)
            else:
                call._follow()
            return call.result()
        except KeyboardInterrupt:
            call.cancel()
            raise

    def spawn(self, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        """Call remotely without waiting; answers a :class:`Call` handle."""
        conn = self._conn()
        info = conn.submit(self._spec_for([(args, kwargs)], conn))
        return Call(conn, info, self._name(), self._fn)

    def map(
        self,
        iterable: Iterable[Any],
        *,
        ordered: bool = True,
        return_exceptions: bool = False,
        max_parallel: int | None = None,
        chunk_size: int | None = None,
        star: bool = False,
        progress: bool | None = None,
    ) -> MapRun[R]:
        """Call once per item; yields the results.

        Parameters
        ----------
        iterable
            One argument per call (with ``star``, a tuple of arguments per call).
        ordered
            Yield in input order (default) or as calls finish.
        return_exceptions
            Yield a call's exception instead of raising it (the rest keep going).
        max_parallel
            Most calls running at once (default: as many as the workers' slots).
        chunk_size
            Calls per job; default spreads the items over a few jobs per slot, so
            a burst of small calls costs a few requests, not one per item.
        progress
            Show progress: a widget in a notebook, a bar in a terminal (default:
            where one of them is available).

        Stopping the iteration early (``break``, an exception, Ctrl-C, or closing
        the returned :class:`MapRun`) cancels the calls that have not finished.
        """
        items = [tuple(x) if star else (x,) for x in iterable]
        if self._spec.kind == contracts.JobKind.distributed:
            if chunk_size not in (None, 1):
                raise ValueError("chunk_size: a distributed function runs one call per gang")
            chunk_size = 1
        conn = self._conn()
        parallel = max_parallel or max(1, _slots(conn, self._spec))
        size = chunk_size or max(
            1, min(_MAX_CHUNK, math.ceil(len(items) / (parallel * _CHUNKS_PER_SLOT)))
        )
        chunks = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
        return MapRun(
            self,
            conn,
            items,
            chunks,
            ordered=ordered,
            return_exceptions=return_exceptions,
            max_parallel=max_parallel,
            progress=Progress.auto(len(items), self._name(), progress),
        )

    # ------------------------------------------------------------ building

    def _name(self) -> str:
        return getattr(self._fn, "__qualname__", None) or getattr(self._fn, "__name__", "function")

    def _conn(self) -> Connection:
        conn = self._options.get("connection")
        return conn if conn is not None else current_connection()

    def _base_spec(self) -> contracts.JobSpec:
        o = self._options
        try:
            gang = {k: o[k] for k in _DISTRIBUTED if k in o}
            return contracts.JobSpec(
                kind="distributed" if gang else "function",
                **gang,
                function={"format": payload.FORMAT, "python": payload.PYTHON, "payload": b"-"},
                name=o.get("name") or self._name()[:128].replace("<", "").replace(">", "") or None,
                env=dict(o.get("env") or {}),
                resources=_resources(
                    profile=o.get("profile"),
                    gpus=o.get("gpus", 0),
                    cpus=o.get("cpus", 1),
                    **{
                        k: o.get(k)
                        for k in (
                            "memory",
                            "gpu_memory",
                            "gpu_model",
                            "accelerator",
                            "worker",
                            "min_compute_capability",
                            "gpu_memory_kind",
                        )
                    },
                    selector=dict(o.get("selector") or {}),
                ),
                timeout=o.get("timeout"),
                retries=o.get("retries", 0),
                priority=o.get("priority", 0),
                labels=dict(o.get("labels") or {}),
            )
        except PydanticValidationError as e:
            raise pydantic_to_gpulayer(e) from e

    def _spec_for(self, calls: list[tuple[tuple, dict]], conn: Connection) -> contracts.JobSpec:
        """The job of one payload: inline when small, else uploaded first."""
        _check_python(conn, self._spec)
        data = payload.pack_calls(self._fn, calls)
        fn: dict[str, Any] = {
            "format": payload.FORMAT,
            "python": payload.PYTHON,
            "name": self._name()[:512],
            "calls": len(calls),
            "retry_exceptions": bool(self._options.get("retry_exceptions", False)),
        }
        if len(data) <= contracts.INLINE_BYTES:
            fn["payload"] = data
        else:
            fn["payload_blob"] = conn.upload_blob(data).sha256
        update: dict[str, Any] = {"function": contracts.FunctionCall(**fn)}
        if self._spec.timeout is not None and len(calls) > 1:
            update["timeout"] = self._spec.timeout * len(calls)  # the timeout is per call
        return self._spec.model_copy(update=update)


# ---------------------------------------------------------------- call handle


class Call(Generic[R]):
    """One remote call: what :meth:`RemoteFunction.spawn` answers.

    Works with :func:`wait` and :func:`as_completed`.
    """

    def __init__(
        self,
        conn: Connection,
        info: contracts.Job,
        name: str = "",
        fn: Callable[..., Any] | None = None,
    ) -> None:
        self.connection = conn
        self.info = info
        self.name = name or info.name
        self._fn = fn  # to show the local source lines of a remote traceback

    def __repr__(self) -> str:
        return f"<Call {self.name} job={self.id} {self.info.state}>"

    @property
    def id(self) -> str:
        """The call's job id."""
        return self.info.id

    @property
    def job(self) -> Job:
        """The call's :class:`~gpulayer.Job` (artifacts, events, placement)."""
        return Job(self.connection, self.info)

    def done(self) -> bool:
        """Whether the call has ended (asks the control plane while it has not)."""
        if not self.info.state.terminal:
            self.info = self.connection.job(self.id)
        return self.info.state.terminal

    def result(self, timeout: float | None = None) -> R:
        """Wait for the call (at most ``timeout`` s) and answer its value.

        Raises
        ------
        Exception
            The remote exception, as its own type, with the remote traceback.
        RemoteError
            When the remote exception's class does not exist here.
        JobFailed
            When the call timed out, was cancelled, or its worker or runner was lost.
        TimeoutError
            If it did not end within ``timeout``.
        """
        if not self.info.state.terminal:
            self.info = self.connection.wait(self.id, timeout)
        (outcome,) = _outcomes(self.connection, self.info) or [None]
        return _value(outcome, self.info, self._fn)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's exception, or None when it returned a value."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as e:  # what the remote function raised is the answer here
            return e
        return None

    def cancel(self) -> bool:
        """Cancel the call (its runner is stopped); False when it had already ended."""
        try:
            self.info = self.connection.cancel(self.id)
        except errors.InvalidTransition:
            return False
        return True

    def logs(self) -> list[str]:
        """What the call printed so far."""
        return self.job.logs()

    def _echo(self, offset: int) -> int:
        """Print stored lines from ``offset`` (stdout and stderr where they belong)."""
        while True:
            page = self.connection.logs(self.id, offset)
            _print_lines(page.lines, offset)
            if page.next_offset <= offset or not page.lines:
                return offset
            offset = page.next_offset

    def _follow(self) -> None:
        """Print lines live until the call ends."""
        offset = 0
        while True:
            page = self.connection.logs(self.id, offset, wait=30.0)
            _print_lines(page.lines, offset)
            offset = max(offset, page.next_offset)
            if page.complete and not page.lines:
                break
        self.info = self.connection.job(self.id)


def _print_lines(lines: Sequence[contracts.LogLine], offset: int) -> None:
    for line in lines:
        if line.offset < offset:
            continue
        stream = sys.stderr if line.stream == contracts.LogStream.stderr else sys.stdout
        if line.stream == contracts.LogStream.system:
            stream = sys.stderr
        text = line.text if line.rank is None else f"[{line.rank}] {line.text}"
        print(text, file=stream, flush=True)


# ------------------------------------------------------------------- results


def _outcomes(conn: Connection, info: contracts.Job) -> list[payload.Outcome]:
    """The outcomes of an ended function job ([] when it has none)."""
    data = info.result
    if data is None and info.result_size:
        data = conn.result(info.id)
    if data is None:
        return []
    return payload.unpack(data, "outcomes")


def _value(
    outcome: payload.Outcome | None, info: contracts.Job, fn: Callable[..., Any] | None
) -> Any:
    """The value of one outcome, or raise what it stands for."""
    if outcome is None:
        raise failure_of(info)
    if outcome.ok:
        return outcome.value
    raise _exception(outcome, info, fn)


def _exception(
    outcome: payload.Outcome, info: contracts.Job, fn: Callable[..., Any] | None
) -> BaseException:
    """The remote exception as raised here: its own type, caused by the remote traceback."""
    exc = outcome.error()
    where = f"raised in job {info.id}" + (
        f" on worker {info.worker_name}" if info.worker_name else ""
    )
    text = _localize(outcome.traceback, fn)
    if exc is None:
        return errors.RemoteError(
            outcome.message,
            remote_type=outcome.error_type,
            remote_traceback=text,
            job_id=info.id,
            worker=info.worker_name,
        )
    exc.__cause__ = errors.RemoteTraceback(text)
    exc.add_note(f"({where})")
    return exc


_DYNAMIC_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (.+)$')


def _localize(text: str, fn: Callable[..., Any] | None) -> str:
    """Name the local file and show the source line of remote frames.

    Code shipped by value arrives as ``<dynamic-code>`` (cloudpickle drops file
    names); the caller still has that code, so its frames are matched by name and
    line to ``fn``'s code (and the functions next to it) and shown as they would
    be locally, notebook cells included.
    """
    if fn is None or "<dynamic-code>" not in text:
        return text
    index = _code_index(fn)
    out = []
    for line in text.splitlines():
        m = _DYNAMIC_FRAME.match(line)
        file = index.get((m[2], int(m[1]))) if m else None
        if m is None or file is None:
            out.append(line)
            continue
        out.append(f'  File "{file}", line {m[1]}, in {m[2]}')
        source = linecache.getline(file, int(m[1])).strip()
        if source:
            out.append(f"    {source}")
    return "\n".join(out) + "\n"


def _code_index(fn: Callable[..., Any]) -> dict[tuple[str, int], str]:
    """``(function name, line) -> file`` for the code ``fn`` may run."""
    index: dict[tuple[str, int], str] = {}
    seen: set[int] = set()

    def add(code: types.CodeType) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        for _, _, line in code.co_lines():
            if line is not None:
                index.setdefault((code.co_name, line), code.co_filename)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)

    root = inspect.unwrap(fn)
    functions = [root]
    if isinstance(getattr(root, "__globals__", None), dict):
        functions += [v for v in root.__globals__.values() if isinstance(v, types.FunctionType)]
    for f in functions:
        if isinstance(getattr(f, "__code__", None), types.CodeType):
            add(f.__code__)
    return index


# ----------------------------------------------------------------------- map


class MapRun(Generic[R]):
    """The iterator :meth:`RemoteFunction.map` answers; closing it cancels the rest."""

    def __init__(
        self,
        fn: RemoteFunction[..., R],
        conn: Connection,
        items: list[tuple],
        chunks: list[list[int]],
        *,
        ordered: bool,
        return_exceptions: bool,
        max_parallel: int | None,
        progress: Progress,
    ) -> None:
        self._fn = fn
        self._conn = conn
        self._items = items
        self._chunks = chunks
        self._ordered = ordered
        self._return_exceptions = return_exceptions
        self._limit = max_parallel
        self._progress = progress
        self._next_chunk = 0
        self._pending: dict[str, int] = {}  # job id -> chunk index
        self._infos: dict[str, contracts.Job] = {}
        self._ready: dict[int, tuple[bool, Any]] = {}  # item index -> (ok, value or exception)
        self._order: list[int] = []  # item indexes in the order they finished
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
        self._yielded += 1
        if self._yielded >= len(self._items):
            self.close()
        if ok or self._return_exceptions:
            return value
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
                self._conn.cancel(job_id)
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
        ended = self._conn.wait_any(list(self._pending), timeout=30.0)
        for info in ended:
            chunk = self._chunks[self._pending.pop(info.id)]
            self._infos[info.id] = info
            try:
                outcomes = _outcomes(self._conn, info)
            except errors.GpulayerError as e:
                outcomes, failure = [], e
            else:
                failure = failure_of(info)
            for k, index in enumerate(chunk):
                if k < len(outcomes):
                    o = outcomes[k]
                    entry = (True, o.value) if o.ok else (False, _exception(o, info, self._fn._fn))
                else:
                    entry = (False, failure)
                self._ready[index] = entry
                self._order.append(index)
            self._progress.update(len(chunk))
        self._submit_more()

    def _submit_more(self) -> None:
        """Submit chunks up to ``max_parallel`` running, in batched requests."""
        room = len(self._chunks) - self._next_chunk
        if self._limit is not None:
            room = min(room, self._limit - len(self._pending))
        while room > 0 and not self._closed:
            specs, first, size = [], self._next_chunk, 0
            while room > 0 and len(specs) < _BATCH_JOBS and size < _BATCH_BYTES:
                chunk = self._chunks[self._next_chunk]
                spec = self._fn._spec_for([(self._items[i], {}) for i in chunk], self._conn)
                specs.append(spec)
                size += len(spec.function.payload or b"") if spec.function else 0
                self._next_chunk += 1
                room -= 1
            jobs = self._conn.submit_many(specs)
            for k, info in enumerate(jobs):
                self._pending[info.id] = first + k
                self._infos[info.id] = info


# ------------------------------------------------------------ wait helpers


def wait(
    calls: Iterable[Call[Any]],
    timeout: float | None = None,
    return_when: Literal["ALL_COMPLETED", "FIRST_COMPLETED"] = "ALL_COMPLETED",
) -> tuple[list[Call[Any]], list[Call[Any]]]:
    """Wait for calls like :func:`concurrent.futures.wait`: answers ``(done, not_done)``."""
    calls = list(calls)
    deadline = None if timeout is None else time.monotonic() + timeout
    for _ in _ended(calls, deadline):
        if return_when == "FIRST_COMPLETED":
            break
    done = [c for c in calls if c.info.state.terminal]
    return done, [c for c in calls if not c.info.state.terminal]


def as_completed(calls: Iterable[Call[Any]], timeout: float | None = None) -> Iterator[Call[Any]]:
    """Yield calls as they end, like :func:`concurrent.futures.as_completed`.

    Raises
    ------
    TimeoutError
        If some have not ended within ``timeout``.
    """
    calls = list(calls)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = 0
    for call in _ended(calls, deadline):
        seen += 1
        yield call
    if seen < len(calls):
        raise TimeoutError(f"{len(calls) - seen} of {len(calls)} calls did not end in time")


def _ended(calls: list[Call[Any]], deadline: float | None) -> Iterator[Call[Any]]:
    """Calls as they end (each once), until all did or the deadline passed."""
    pending = {}
    for call in calls:
        if call.info.state.terminal:
            yield call
        else:
            pending.setdefault(call.connection, {})[call.id] = call
    while any(pending.values()):
        for conn, by_id in pending.items():
            if not by_id:
                continue
            hold = 30.0 if deadline is None else deadline - time.monotonic()
            if hold <= 0:
                return
            hold = min(hold, 30.0) if len(pending) == 1 else min(hold, 0.5)
            for info in conn.wait_any(list(by_id), timeout=hold):
                call = by_id.pop(info.id)
                call.info = info
                yield call


# ------------------------------------------------------------- worker checks

_workers_cache: dict[int, tuple[float, list[contracts.Worker]]] = {}


def _workers(conn: Connection) -> list[contracts.Worker]:
    now = time.monotonic()
    hit = _workers_cache.get(id(conn))
    if hit is None or now - hit[0] > _WORKERS_TTL_SECONDS:
        try:
            hit = (now, conn.workers())
        except errors.AuthError:  # a token that may submit but not list workers
            hit = (now, [])
        _workers_cache[id(conn)] = hit
    return hit[1]


def _check_python(conn: Connection, spec: contracts.JobSpec) -> None:
    """Refuse, before submitting, when every live worker runs another Python."""
    live = [w for w in _workers(conn) if w.state in ("ready", "draining") and w.python]
    wanted = spec.resources.worker
    if wanted:
        live = [w for w in live if w.name == wanted]
    if live and all(w.python != payload.PYTHON for w in live):
        versions = ", ".join(sorted({f"{w.name}: {w.python}" for w in live}))
        raise errors.PayloadError(
            f"Python version mismatch: this process runs Python {payload.PYTHON}, the workers"
            f" run {versions}. Pickled functions only move between the same Python minor"
            " version: start the kernel (or the workers) with a matching Python, e.g. the"
            " same conda or venv.",
            field="python",
        )


def _slots(conn: Connection, spec: contracts.JobSpec) -> int:
    """Slots of the ready workers (an estimate of how many calls run at once)."""
    ready = [w for w in _workers(conn) if w.state == "ready"]
    if spec.resources.worker:
        ready = [w for w in ready if w.name == spec.resources.worker]
    return sum(w.slots for w in ready)
