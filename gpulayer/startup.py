"""A gpulayer process's start-up: without the garbage collector (ADR 0147) and
without pydantic's plugin discovery (ADR 0148).

Importing a control plane or a worker creates ~100,000 objects, nearly all of them
for good (modules, classes, functions), and the collector walks them again and
again as they pile up: 190 collections and ~50 ms of a control plane's start, ~35
ms of a worker's. The entry points of those processes (``python -m jupyter_ext``,
``python -m gpulayer``) call :func:`hold_gc` first; once the process is serving
they call :func:`release_gc`, which moves everything alive into the permanent
generation (``gc.freeze``), so that later full collections skip it, and turns the
collector back on. A process that never held it (a notebook that imports
gpulayer, a control plane inside ``jupyter lab``) is left alone.

The same entry points call :func:`skip_pydantic_plugins`: pydantic looks for
plugins in the entry points of every installed distribution when it builds its
first validator, on the first call's path in each process (~10-20 ms).
"""

import gc

_held = False


def hold_gc() -> None:
    """Turn the collector off until :func:`release_gc` (when it is on)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release_gc() -> None:
    """Freeze what start-up left alive and turn the collector back on, once, if
    :func:`hold_gc` turned it off; otherwise do nothing."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()


def skip_pydantic_plugins() -> None:
    """Let pydantic find no plugins in this process (ADR 0148): its discovery reads
    the entry points of every installed distribution, once, at the first validator.

    Only gpulayer's own processes call it; a notebook's gpulayer keeps whatever
    plugins its user installed. It answers pydantic's cache of discovered plugins
    (``pydantic.plugin._loader._plugins``) as empty; where a pydantic release keeps
    them elsewhere it does nothing, and the discovery runs as before.
    """
    from pydantic.plugin import _loader

    if getattr(_loader, "_plugins", False) is None:  # not discovered yet
        _loader._plugins = {}
