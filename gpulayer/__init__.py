"""gpulayer: run notebook work on GPU machines as if it were local.

>>> import gpulayer as gl
>>> gl.connect()                       # GPULAYER_URL/TOKEN or the config `gpulayer up` wrote
>>> job = gl.submit(["python", "-c", "print('hi')"])
>>> job.wait().state
'succeeded'
>>> @gl.remote(gpus=1)
... def square(x):
...     return x * x
>>> square.run(3)
9

``import gpulayer`` stays light: the HTTP client loads on first use, and torch,
IPython and ipywidgets only where a feature needs them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` loads them on first use
    from gpulayer.client.connection import Connection
    from gpulayer.client.default import connect, current_connection
    from gpulayer.client.environments import Env
    from gpulayer.client.jobs import Job, submit
    from gpulayer.functions import Call, RemoteFunction, as_completed, remote, wait

#: The one version source: pyproject.toml reads it (hatch); labextension/package.json
#: follows it (tests/unit/test_packaging.py).
__version__ = "0.1.0"

__all__ = [
    "Call",
    "Connection",
    "Env",
    "Job",
    "RemoteFunction",
    "__version__",
    "as_completed",
    "connect",
    "current_connection",
    "load_ipython_extension",
    "remote",
    "submit",
    "wait",
]

_LAZY = {
    "Connection": "gpulayer.client.connection",
    "Env": "gpulayer.client.environments",
    "Job": "gpulayer.client.jobs",
    "connect": "gpulayer.client.default",
    "current_connection": "gpulayer.client.default",
    "submit": "gpulayer.client.jobs",
    "remote": "gpulayer.functions",
    "RemoteFunction": "gpulayer.functions",
    "Call": "gpulayer.functions",
    "wait": "gpulayer.functions",
    "as_completed": "gpulayer.functions",
}


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpulayer``: the ``%%gpulayer`` and ``%gpulayer`` magics (imported
    only now, so ``import gpulayer`` stays free of IPython)."""
    from gpulayer.notebook import magics

    magics.load(ipython)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gpulayer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
