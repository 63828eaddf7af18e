"""Progress for people, drawn by one library: ``tqdm.auto``.

In a Jupyter kernel ``tqdm.auto`` draws an ipywidgets bar; in a terminal, one line
rewritten in place. Every progress display of gpulayer comes from here:
``RemoteFunction.map`` (:func:`bar`), the Trainer's
:class:`~gpulayer.pytorch.ProgressBar`, ``gpulayer up`` starting (:func:`steps`)
and transfers of bundles and artifacts (:func:`transfer`).

Where nobody watches (a script whose output goes to a file, CI, a job's log) a bar
shows nothing unless asked (``want=True``). tqdm is imported on first use, so
importing this module stays light.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TextIO


class Bar(Protocol):
    """What callers use of a bar (a ``tqdm``): count, and close when done."""

    def update(self, n: int = 1) -> object:
        """``n`` more items are done."""
        ...

    def close(self) -> None:
        """The run ended (or was stopped): draw the last state."""
        ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object:
        """Show ``s`` after the count (why it waits, say)."""
        ...


#: A start-up's steps: ``starting gpulayer: 1/2 [00:03, control plane ready, waiting for workers]``.
STEPS_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

#: What a transfer reports: bytes moved so far, and the total when it is known.
TransferCallback = Callable[[int, int | None], None]


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (not a terminal IPython)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def wanted(want: bool | None, stream: TextIO | None = None) -> bool:
    """Whether to show progress: ``want`` when given, else in a notebook or when
    ``stream`` (default ``sys.stderr``) is a terminal."""
    if want is not None:
        return want
    if in_notebook():
        return True
    isatty = getattr(stream or sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


def bar(
    total: int | float | None,
    desc: str = "",
    *,
    want: bool | None = None,
    stream: TextIO | None = None,
    **options: Any,
) -> Any:
    """A ``tqdm.auto`` bar counting to ``total``: a widget in a notebook, a line in a
    terminal (on ``stream``, default ``sys.stderr``), nothing where :func:`wanted`
    says no or when ``total`` is 0. ``options`` go to tqdm (``unit``, ``unit_scale``,
    ``leave``, ``postfix``, ...). A disabled bar takes ``update`` and ``close`` and
    draws nothing."""
    from tqdm.auto import tqdm

    show = wanted(want, stream) and total != 0
    return tqdm(total=total, desc=desc, file=stream or sys.stderr, disable=not show, **options)


def steps(names: list[str], desc: str, *, want: bool | None = None) -> Callable[[str], None]:
    """A bar over the named steps of a start-up: call the answer with each step's name
    as it completes (``"control plane"``, ``"worker local-1"``); it closes after the last."""
    progress = bar(len(names), desc, want=want, leave=False, bar_format=STEPS_FORMAT)
    progress.set_postfix_str(f"waiting for {names[0]}" if names else "")
    left = list(names)

    def done(name: str) -> None:
        if name in left:
            left.remove(name)
            progress.update(1)
            progress.set_postfix_str(f"{name} ready" + (f", waiting for {left[0]}" if left else ""))
        if not left:
            progress.close()

    return done


class Transfer:
    """A bytes bar (KiB, MiB, rate) for one streamed upload or download, called as a
    transfer module's ``progress(done_bytes, total_bytes)``; it closes itself when
    ``done == total`` (or at :meth:`close`, or the end of a ``with`` block, for a
    transfer whose size is not known, such as packing)."""

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        *,
        want: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self._bar = bar(
            total, desc, want=want, stream=stream, unit="B", unit_scale=True, unit_divisor=1024
        )

    def __call__(self, done: int, size: int | None = None) -> None:
        """``done`` bytes moved so far, of ``size`` (None while unknown)."""
        progress = self._bar
        if size is not None and progress.total != size:
            progress.total = size
        progress.update(done - progress.n)
        if size is not None and done >= size:
            progress.close()

    def close(self) -> None:
        """Draw the last state and finish the line (idempotent)."""
        self._bar.close()

    def __enter__(self) -> Transfer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def transfer(desc: str, total: int | None = None, *, want: bool | None = None) -> Transfer:
    """A progress callback for a streamed upload or download: see :class:`Transfer`."""
    return Transfer(desc, total, want=want)


#: What an API that moves files takes as ``progress``: None (a bar where someone
#: watches: a notebook or a terminal), True (a bar always), False (none), or a
#: ``progress(done_bytes, total_bytes)`` callback of the caller's own.
ProgressOption = bool | TransferCallback | None


@contextlib.contextmanager
def transfer_progress(option: ProgressOption, desc: str) -> Iterator[TransferCallback | None]:
    """The callback for one transfer from a ``progress=`` option (:data:`ProgressOption`):
    the caller's own, or a :class:`Transfer` bar named ``desc`` closed at the end of
    the ``with`` block (None when ``False`` or nobody watches)."""
    if callable(option):
        yield option
        return
    if not wanted(option):
        yield None
        return
    with Transfer(desc, want=True) as shown:
        yield shown


class Progress:
    """Kept for code that names it: ``Progress.auto(total, desc, want)`` is :func:`bar`."""

    @staticmethod
    def auto(total: int, desc: str, want: bool | None = None) -> Bar:
        """The progress bar for here (see :func:`bar`)."""
        shown: Bar = bar(total, desc, want=want)
        return shown
