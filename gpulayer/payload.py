"""Pickled calls and their outcomes: what a remote function or a pushed variable travels as.

A payload is ``MAGIC``, a 4-byte header length, a small JSON header, then a
cloudpickle body::

    b"GLP\\x01" | len(header) | {"format": 1, "python": "3.11", "kind": "calls"} | body

The header is read before anything is unpickled, so a payload from another
Python (pickled code objects do not cross minor versions) or from a newer
gpulayer is refused with a message that says what to do, not with a confusing
unpickling error.

Functions and classes from the user's own modules (files outside site-packages
and the standard library) are pickled *by value*, so a worker that never had
the module can run them; installed packages travel by reference and must be
installed on the worker.
"""

import functools
import json
import os
import struct
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import cloudpickle

from gpulayer.errors import PayloadError

FORMAT = 1
MAGIC = b"GLP\x01"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
_HEADER = struct.Struct(">I")
_MAX_HEADER = 4096
_INSTALLED_DIRS = ("site-packages", "dist-packages")
_register_lock = threading.Lock()

Kind = Literal["calls", "outcomes", "values"]


@dataclass(frozen=True)
class Header:
    """What a payload says about itself before it is unpickled."""

    format: int
    python: str
    kind: str


# ------------------------------------------------------------------ envelope


def pack(kind: Kind, obj: Any, *, what: str = "the call") -> bytes:
    """``obj`` pickled with cloudpickle behind a header.

    Raises
    ------
    PayloadError
        If something in ``obj`` cannot be pickled; the message names ``what``.
    """
    with _register_lock, _local_modules_by_value():
        try:
            body: bytes = cloudpickle.dumps(obj, protocol=5)
        except Exception as e:  # pickling runs arbitrary __reduce__ code: any error
            raise PayloadError(
                f"cannot send {what}: {type(e).__name__}: {e}. Objects such as open files,"
                " locks, sockets, generators and live connections cannot be pickled; create"
                " them inside the remote function instead, or pass what is needed to make them",
                field="payload",
            ) from e
    return _envelope(kind, FORMAT, PYTHON) + body


@functools.cache
def _envelope(kind: str, format_: int, python: str) -> bytes:
    """What comes before the body of every payload of ``kind`` made here (cached per
    ``format_`` and ``python`` too: what a process pretending to be another makes)."""
    header = json.dumps({"format": format_, "python": python, "kind": kind}).encode()
    return MAGIC + _HEADER.pack(len(header)) + header


def header(data: bytes | memoryview) -> Header:
    """The header of a payload, checked; nothing is unpickled.

    Raises
    ------
    PayloadError
        Not a gpulayer payload, a newer format, or another Python minor version.
    """
    view = memoryview(data)
    if bytes(view[:4]) != MAGIC or len(view) < 8:
        raise PayloadError("not a gpulayer payload (bad magic bytes)", field="payload")
    (n,) = _HEADER.unpack(view[4:8])
    if n > _MAX_HEADER or len(view) < 8 + n:
        raise PayloadError("corrupt gpulayer payload (bad header length)", field="payload")
    return _checked_header(bytes(view[8 : 8 + n]), FORMAT, PYTHON)


@functools.lru_cache(maxsize=16)
def _checked_header(raw: bytes, format_: int, python: str) -> Header:
    """A payload's JSON header, read and checked against this gpulayer's ``format_``
    and ``python`` (a few kinds recur: each is read once).

    Raises
    ------
    PayloadError
        A corrupt header, a newer format, or another Python minor version.
    """
    try:
        meta = json.loads(raw)
        head = Header(int(meta["format"]), str(meta["python"]), str(meta["kind"]))
    except (ValueError, KeyError, TypeError) as e:
        raise PayloadError(f"corrupt gpulayer payload header: {e}", field="payload") from e
    if head.format > format_:
        raise PayloadError(
            f"payload format {head.format} is newer than this gpulayer understands ({format_});"
            " upgrade gpulayer here to the version the sender runs",
            field="payload",
        )
    check_python(head.python, here="this process")
    return head


def unpack(data: bytes | memoryview, kind: Kind) -> Any:
    """The object inside a payload of ``kind`` (unpickles: only from trusted senders)."""
    head = header(data)
    if head.kind != kind:
        raise PayloadError(f"expected a {kind!r} payload, got {head.kind!r}", field="payload")
    start = 8 + _HEADER.unpack(memoryview(data)[4:8])[0]
    return cloudpickle.loads(memoryview(data)[start:])


def check_python(theirs: str, *, here: str) -> None:
    """Refuse a peer whose Python minor version differs from ours.

    Raises
    ------
    PayloadError
        With a message that names both versions and what to do.
    """
    if theirs != PYTHON:
        raise PayloadError(
            f"Python version mismatch: the payload was made by Python {theirs} and"
            f" {here} runs Python {PYTHON}; pickled functions only move between the same"
            " Python minor version. Run the notebook kernel and the worker with the same"
            " Python (e.g. the same conda or venv), or pick a matching worker with"
            " selector=/worker=",
            field="payload",
        )


# --------------------------------------------------------------------- calls


#: The arguments of one call: ``(args, kwargs)``.
CallArgs = tuple[tuple[Any, ...], dict[str, Any]]


def pack_calls(fn: Callable[..., Any], calls: Iterable[CallArgs]) -> bytes:
    """A payload for calling ``fn`` once per ``(args, kwargs)`` in ``calls``."""
    name = getattr(fn, "__qualname__", repr(fn))
    return pack("calls", (fn, list(calls)), what=f"a call of {name}()")


@dataclass
class Outcome:
    """The end of one call: a value, or an exception with its remote traceback.

    The exception travels pickled on its own (``error_pickle``), so a class that
    does not unpickle on the client costs only that exception (re-raised as
    :class:`~gpulayer.errors.RemoteError`), not the whole result.
    """

    ok: bool
    value: Any = None
    error_pickle: bytes | None = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""

    @property
    def skipped(self) -> bool:
        """A call this attempt did not make: an earlier attempt finished it and its
        outcome is kept apart (a result part, docs/adr/0096)."""
        return not self.ok and self.error_type == SKIPPED

    def error(self) -> BaseException | None:
        """The remote exception, unpickled, or None when it cannot be here."""
        if self.error_pickle is None:
            return None
        try:
            exc = cloudpickle.loads(self.error_pickle)
        except Exception:  # its class or module does not exist here
            return None
        return exc if isinstance(exc, BaseException) else None


#: ``Outcome.error_type`` of a call a retry did not make (:attr:`Outcome.skipped`).
SKIPPED = "gpulayer.skipped"


def skipped() -> Outcome:
    """The placeholder outcome of a call an earlier attempt finished."""
    why = "made by an earlier attempt of this job; its outcome is kept as a result part"
    return Outcome(False, None, None, SKIPPED, why, "")


@dataclass(frozen=True)
class Summary:
    """What a worker needs to know about a finished payload without unpickling it."""

    calls: int
    errors: int
    first_error: str  # "ValueError: bad input" of the first call that raised, or ""


def run_calls(
    data: bytes | memoryview,
    *,
    skip: Iterable[int] = (),
    on_outcome: Callable[[int, Outcome], None] | None = None,
) -> tuple[bytes, Summary]:
    """Unpack a ``calls`` payload, make each call, and pack the outcomes.

    Never raises for what the user's function does: an exception (including
    ``KeyboardInterrupt``/``SystemExit``) becomes that call's outcome. A payload
    that cannot be unpacked is one failed outcome that explains why. Calls whose
    index is in ``skip`` are not made (their outcome is :func:`skipped`, counted
    neither as a call nor as an error); ``on_outcome(index, outcome)`` hears of
    each call made as soon as it returned.
    """
    try:
        fn, calls = unpack(data, "calls")
    except Exception as e:  # unpickling runs the sender's code: anything can fail
        outcomes = [_failure(e, skip=0)]
    else:
        outcomes = []
        done = frozenset(skip)
        for index, (args, kwargs) in enumerate(calls):
            if index in done:
                outcomes.append(skipped())
                continue
            try:
                outcome = Outcome(True, fn(*args, **kwargs))
            except BaseException as e:  # the user's exception is the call's answer
                outcome = _failure(e, skip=1)
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(index, outcome)
    try:
        packed = pack("outcomes", outcomes, what="the result")
    except PayloadError:  # a value that cannot travel becomes that call's error
        outcomes = [_sendable(o) for o in outcomes]
        packed = pack("outcomes", outcomes, what="the result")
    made = [o for o in outcomes if not o.skipped]
    failed = [o for o in made if not o.ok]
    first = f"{failed[0].error_type}: {failed[0].message}" if failed else ""
    return packed, Summary(len(made), len(failed), first)


def pack_outcome(outcome: Outcome) -> bytes:
    """One call's outcome as an ``outcomes`` payload of its own (a result part); a
    value that cannot travel becomes that call's error, as in :func:`run_calls`."""
    try:
        return pack("outcomes", [outcome], what="the result")
    except PayloadError:
        return pack("outcomes", [_sendable(outcome)], what="the result")


def _sendable(o: Outcome) -> Outcome:
    try:
        cloudpickle.dumps(o.value, protocol=5)
        return o
    except Exception as e:  # any __reduce__ error
        why = PayloadError(
            f"the function returned a {type(o.value).__name__} that cannot be sent back:"
            f" {type(e).__name__}: {e}",
            field="result",
        )
        return _failure(why, skip=0)


def _failure(e: BaseException, *, skip: int) -> Outcome:
    tb = e.__traceback__
    for _ in range(skip):  # drop run_calls' own frame
        if tb is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(e), e, tb))
    e.__traceback__ = None  # tracebacks do not pickle; the text travels instead
    try:
        with _register_lock, _local_modules_by_value():
            pickled: bytes | None = cloudpickle.dumps(e, protocol=5)
    except Exception:  # an exception with unpicklable state: its text still travels
        pickled = None
    return Outcome(False, None, pickled, type(e).__qualname__, str(e), text)


# ------------------------------------------------------------ local modules


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(p for p in sys.path if p.rstrip(os.sep).endswith(_INSTALLED_DIRS))
    return tuple(os.path.realpath(r) + os.sep for r in roots)


_is_local_cache: dict[str, bool] = {}


def _is_local(name: str, mod: ModuleType) -> bool:
    if name == "__main__" or name.split(".")[0] in ("gpulayer", "jupyter_ext"):
        return False
    file = getattr(mod, "__file__", None)
    if not file or not file.endswith(".py"):
        return False
    path = _real_path(file)
    return not path.startswith(_installed_roots()) and not any(d in path for d in _INSTALLED_DIRS)


def _real_path(file: str) -> str:
    """``os.path.realpath(file)``, each folder resolved once: hundreds of modules
    share a few dozen folders, and resolving every one of them, component by
    component, took ~20 ms of a kernel's first call."""
    if os.path.islink(file):
        return os.path.realpath(file)
    folder, name = os.path.split(file)
    return os.path.join(_real_folder(folder), name)


@functools.cache
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


_local_names: tuple[tuple[int, str], list[str]] = ((-1, ""), [])


def local_modules() -> Iterator[ModuleType]:
    """Modules imported from the user's own files: not built in, not under the
    standard library or site-packages, not gpulayer itself. Each module name is
    judged once (checking paths is slow; a payload is made per call), and the names
    are listed again only when ``sys.modules`` changed: a new import is added at
    its end, so its size and its last name tell (a call's payload is made per call,
    and there are hundreds of modules to go through)."""
    global _local_names
    modules = sys.modules
    key = (len(modules), next(reversed(modules), ""))
    if _local_names[0] != key:
        names = []
        for name, mod in list(modules.items()):
            if mod is None:
                continue
            local = _is_local_cache.get(name)
            if local is None:
                local = _is_local_cache[name] = _is_local(name, mod)
            if local:
                names.append(name)
        _local_names = (key, names)
    for name in _local_names[1]:
        found = modules.get(name)
        if found is not None:
            yield found


class _local_modules_by_value:
    """While active, cloudpickle ships the user's local modules by value."""

    def __enter__(self) -> None:
        self.registered: list[ModuleType] = []
        for mod in local_modules():
            try:
                cloudpickle.register_pickle_by_value(mod)
                self.registered.append(mod)
            except ValueError:  # already registered by the user: leave it so
                pass

    def __exit__(self, *exc: object) -> None:
        for mod in self.registered:
            cloudpickle.unregister_pickle_by_value(mod)
