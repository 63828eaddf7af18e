"""Remote functions: ``@gl.remote`` runs a Python function on a worker.

* :mod:`~gpulayer.functions.decorator`: :func:`remote` and :class:`RemoteFunction`
  (options, ``run``, ``spawn``, ``map``, the call's job)
* :mod:`~gpulayer.functions.calls`: the :class:`Call` handle, :func:`wait`, :func:`as_completed`
* :mod:`~gpulayer.functions.mapping`: :class:`MapRun`, what ``map`` answers
* :mod:`~gpulayer.functions.tracebacks`: outcomes and remote exceptions raised here
* :mod:`~gpulayer.functions.checks`: the workers' Python versions and slots
"""

from gpulayer.functions.calls import Call, as_completed, wait
from gpulayer.functions.decorator import RemoteFunction, remote
from gpulayer.functions.mapping import MapRun

__all__ = ["Call", "MapRun", "RemoteFunction", "as_completed", "remote", "wait"]
