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

(No module is called ``remote``: a submodule of that name would replace
the ``gl.remote`` decorator on the package once imported; docs/adr/0012.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from gpulayer import contracts, payload
from gpulayer.client import specs
from gpulayer.client.connection import Connection
from gpulayer.client.default import current_connection
from gpulayer.functions.calls import Call, echo
from gpulayer.functions.checks import check_python, slots
from gpulayer.functions.mapping import MapRun
from gpulayer.functions.tracebacks import outcomes, value
from gpulayer.notebook import progress as progress_display

P = ParamSpec("P")
R = TypeVar("R")

_QUICK_WAIT_SECONDS = 0.5  # a .run() answer waits this long before following logs
_CHUNKS_PER_SLOT = 4  # map: chunks per parallel slot, for load balance
_MAX_CHUNK = 512

_OPTIONS = frozenset(
    {*specs.RESOURCE_OPTIONS, *specs.JOB_OPTIONS, *specs.GANG_OPTIONS, *specs.ENV_OPTIONS}
    | {"retry_exceptions", "connection"}
)


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
    queue_timeout
        Per call: the longest wait for a worker (``"10m"``); a call still queued
        then ends ``timed_out`` with the reason it waited.
    retries
        Extra attempts after the runner crashed or its worker was lost.
    retry_exceptions
        Also retry when the function raises (default: an exception is the answer).
    name, env, labels, priority
        Of each call's job; ``name`` defaults to the function's name.
    secrets
        Names of your secrets each call gets as environment variables (a warm
        runner started with them serves only calls given the same values).
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
        # One Env for every call: its requirements file is read, its local packages
        # uploaded, once.
        env = specs.environment(self._options)
        for k in specs.ENV_OPTIONS:
            self._options.pop(k, None)
        if env is not None:
            self._options["environment"] = env
        functools.update_wrapper(self, fn)
        self._spec = self._base_spec()  # malformed options fail at decoration time

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items() if k != "connection")
        return f"<RemoteFunction {getattr(self._fn, '__qualname__', self._fn)}({opts})>"

    @property
    def function(self) -> Callable[P, R]:
        """The wrapped function (what runs on the worker)."""
        return self._fn

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
        spec = self.spec_for([(args, kwargs)], conn)
        end = conn.submit_ended(spec, wait=_QUICK_WAIT_SECONDS)
        if end.state.terminal:  # the usual answer: read without the job's spec
            if end.log_lines:
                echo(conn, end.id)
            got: list[payload.Outcome | None] = [*outcomes(conn, end)] or [None]
            answer: R = value(got[0], end, self._fn)
            return answer
        call: Call[R] = Call(conn, conn.job(end.id, retry=True), self._name(), self._fn)
        try:
            call.follow()
            return call.result()
        except KeyboardInterrupt:
            call.cancel()
            raise

    def spawn(self, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        """Call remotely without waiting; answers a :class:`Call` handle."""
        conn = self._conn()
        info = conn.submit(self.spec_for([(args, kwargs)], conn))
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
            a burst of small calls costs a few requests, not one per item. Each
            call's outcome is kept as it finishes, so a chunk whose worker dies
            still hands over the calls it finished (the rest fail as ``lost``), and
            its retries (``retries``) make only the calls that did not finish.
        progress
            Show progress: a widget in a notebook, a bar in a terminal (default:
            where one of them is available). While calls are queued it says why
            (``queued: local-1: all 2 task slots busy``, or ``cannot start: ...``
            with what to do), asking every couple of seconds.

        Notes
        -----
        Stopping the iteration early (``break``, an exception, Ctrl-C, or closing
        the returned :class:`MapRun`) cancels the calls that have not finished.
        """
        items = [tuple(x) if star else (x,) for x in iterable]
        if self._spec.kind == contracts.JobKind.distributed:
            if chunk_size not in (None, 1):
                raise ValueError("chunk_size: a distributed function runs one call per gang")
            chunk_size = 1
        conn = self._conn()
        parallel = max_parallel or max(1, slots(conn, self._spec))
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
            progress=progress_display.bar(len(items), self._name(), want=progress, unit="call"),
        )

    # ------------------------------------------------------------ building

    def _name(self) -> str:
        name = getattr(self._fn, "__qualname__", None) or getattr(self._fn, "__name__", None)
        return str(name or "function")

    def _conn(self) -> Connection:
        conn = self._options.get("connection")
        return conn if conn is not None else current_connection()

    def _base_spec(self) -> contracts.JobSpec:
        """The job every call starts from (its payload a placeholder)."""
        name = self._options.get("name") or self._name()[:128].replace("<", "").replace(">", "")
        return specs.job_spec(
            {**self._options, "name": name or None},
            by_presence=True,
            kind=contracts.JobKind.function,
            function={"format": payload.FORMAT, "python": payload.PYTHON, "payload": b"-"},
        )

    def spec_for(self, calls: list[payload.CallArgs], conn: Connection) -> contracts.JobSpec:
        """The job of one payload: inline when small, else uploaded first."""
        check_python(conn, self._spec)
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
        spec = specs.with_environment(self._spec, self._options, conn)
        return spec.model_copy(update=update)
