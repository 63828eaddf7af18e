"""Variables that move between a notebook and a remote kernel (``--push`` / ``--pull``).

Both directions use one :mod:`gpulayer.payload` of kind ``values``: a dict
``name -> value`` pickled with cloudpickle behind the Python-version header, so
a kernel on another Python minor version refuses it with a message that says so
instead of failing to unpickle. Small payloads travel inline in the cell's job
(``CellSpec.push``) or completion; large ones through the blob store.

:func:`pack` and :func:`unpack` run in the notebook; :func:`push` and
:func:`pull` run inside the remote kernel (the worker executes a one-line call
to them around the cell), reading and writing a file the worker names.
"""

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpulayer import payload
from gpulayer.errors import PayloadError


def pack(namespace: Mapping[str, Any], names: Iterable[str], *, where: str) -> bytes:
    """The ``values`` payload of ``names`` taken from ``namespace``.

    Raises
    ------
    PayloadError
        If a name is not defined in ``namespace`` (``where`` says whose it is),
        or a value cannot be pickled; the message names the variable.
    """
    values = {}
    for name in names:
        if name not in namespace:
            raise PayloadError(f"cannot send variable {name!r}: it is not defined {where}")
        values[name] = namespace[name]
    try:
        return payload.pack("values", values, what=f"variables {', '.join(values)}")
    except PayloadError:
        for name, value in values.items():  # name the one that does not pickle
            payload.pack("values", {name: value}, what=f"variable {name!r}")
        raise


def unpack(data: bytes) -> dict[str, Any]:
    """The variables in a ``values`` payload (checks its format and Python version)."""
    values = payload.unpack(data, "values")
    if not isinstance(values, dict):
        raise PayloadError("a values payload must hold a dict of variables")
    return values


def push(path: str, namespace: dict[str, Any]) -> None:
    """In the remote kernel: set the variables of the payload file at ``path``."""
    try:
        namespace.update(unpack(Path(path).read_bytes()))
    finally:
        Path(path).unlink(missing_ok=True)


def pull(path: str, namespace: Mapping[str, Any], names: list[str]) -> None:
    """In the remote kernel: write the payload of ``names`` to ``path``."""
    Path(path).write_bytes(pack(namespace, names, where="in the remote kernel"))
