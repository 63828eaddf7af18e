"""What tests share besides fixtures: polling to a deadline instead of sleeping.

Import it relatively (pytest runs with ``--import-mode=importlib``, and every test
module is part of the ``tests`` package tree): ``from ..support import until``.
"""

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail the
    test after ``timeout`` s. ``check`` runs at least once, and once more at the end."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


async def until_async(
    check: Callable[[], object | Awaitable[object]], timeout: float = 20.0, what: str = "condition"
) -> Any:
    """:func:`until` inside an event loop: ``check`` may be a plain or an async callable,
    and the loop keeps running between tries."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def until_long_polls(jp_serverapp: Any, n: int = 1, timeout: float = 10.0) -> None:
    """Until ``n`` long polls (acquire, wait, logs) are open on the test server."""
    notifier = jp_serverapp.web_app.settings["gpulayer"].running.plane.notifier
    await until_async(lambda: notifier.waiting() >= n, timeout, f"{n} open long poll(s)")


def entries(root: Path) -> Iterator[Path]:
    """Every file and folder under ``root``, tolerating folders that vanish while it
    walks (``Path.rglob`` raises when a folder is removed under it)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(folder, name)


def files(root: Path) -> set[Path]:
    """The files under ``root`` now (see :func:`entries`)."""
    return {p for p in entries(root) if p.is_file()}
