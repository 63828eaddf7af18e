"""What a remote call answered, as raised here: outcomes, values, and remote
exceptions as their own types with the remote traceback as ``__cause__``."""

from __future__ import annotations

import inspect
import linecache
import re
import types
from collections.abc import Callable
from typing import Any

from gpulayer import contracts, errors, payload
from gpulayer.client.connection import Connection
from gpulayer.client.jobs import failure_of


def outcomes(conn: Connection, info: contracts.Job | contracts.JobEnd) -> list[payload.Outcome]:
    """The outcomes of an ended function job ([] when it has none)."""
    data = info.result
    if data is None and info.result_size:
        data = conn.result(info.id)
    if data is None:
        return []
    got: list[payload.Outcome] = payload.unpack(data, "outcomes")
    return got


def call_outcomes(
    conn: Connection, info: contracts.Job, calls: int
) -> list[payload.Outcome | None]:
    """The outcome of each of an ended function job's ``calls``, None for a call that
    never finished: from the call's result part when one is kept (an earlier attempt
    made it, or the attempt that made it delivered no result; docs/adr/0096), else
    from the job's result."""
    got: list[payload.Outcome | None] = [*outcomes(conn, info)]
    got = [None if o is None or o.skipped else o for o in got[:calls]]
    got += [None] * (calls - len(got))
    if info.result_parts and None in got:
        for part in conn.result_parts(info.id).parts:
            if part.index < calls and got[part.index] is None:
                (got[part.index],) = payload.unpack(part.outcome, "outcomes")
    return got


def value(
    outcome: payload.Outcome | None,
    info: contracts.Job | contracts.JobEnd,
    fn: Callable[..., Any] | None,
) -> Any:
    """The value of one outcome, or raise what it stands for."""
    if outcome is None:
        raise failure_of(info)
    if outcome.ok:
        return outcome.value
    raise exception(outcome, info, fn)


def exception(
    outcome: payload.Outcome,
    info: contracts.Job | contracts.JobEnd,
    fn: Callable[..., Any] | None,
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
