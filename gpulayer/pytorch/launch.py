"""Run a function as a DDP job on local processes, the way ``torchrun`` would.

:func:`launch` starts ``nproc_per_node`` processes (``spawn``), gives each the
variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` on a free
loopback port), calls the function in each and returns rank 0's result. Inside,
:class:`~gpulayer.pytorch.Runtime` and the :class:`~gpulayer.pytorch.Trainer`
find the world exactly as under torchrun: the same code runs under both.

The function travels with cloudpickle, by value when it was defined in
``__main__``, a notebook or a module that is not installed, so functions from
notebooks and test files work. When a rank raises, the other ranks are stopped
and :class:`LaunchError` carries the failing rank and its traceback.
"""

import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from gpulayer.errors import GpulayerError

T = TypeVar("T")

_RESULT_FILE = "result.pkl"
_ERROR_FILE = "error-{rank}.txt"


class LaunchError(GpulayerError):
    """A rank of a :func:`launch` failed.

    Attributes
    ----------
    rank : int | None
        The first rank that failed (``None`` if it died without a Python error).
    remote_traceback : str
        That rank's traceback, or what torch reported.
    """

    code = "launch_failed"

    def __init__(self, message: str, *, rank: int | None, remote_traceback: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def launch(
    fn: Callable[..., T],
    *args: Any,
    nproc_per_node: int = 2,
    master_port: int | None = None,
    threads_per_process: int | None = None,
    start_method: Literal["spawn", "fork", "forkserver"] = "spawn",
    **kwargs: Any,
) -> T:
    """Call ``fn(*args, **kwargs)`` in ``nproc_per_node`` processes forming one DDP world.

    Parameters
    ----------
    fn
        The function each rank runs. It may build a ``Trainer`` and call
        ``fit``: the trainer joins the process group (gloo on CPU, NCCL on
        CUDA, one GPU per rank).
    *args, **kwargs
        Its arguments (pickled with cloudpickle).
    nproc_per_node
        How many processes.
    master_port
        The rendezvous port on 127.0.0.1 (default: a free one).
    threads_per_process
        ``torch.set_num_threads`` in each rank; default: the CPUs divided among
        the ranks, unless ``OMP_NUM_THREADS`` is set.
    start_method
        ``"spawn"`` (fresh interpreters: safe everywhere, a few seconds to
        import torch in each) or ``"fork"`` (starts at once; only where CUDA is
        not yet initialized in this process, and not on macOS).

    Returns
    -------
    Any
        What ``fn`` returned on rank 0 (it must pickle).

    Raises
    ------
    LaunchError
        If any rank raised or died; the others are terminated.

    Examples
    --------
    >>> def train():
    ...     trainer = Trainer(max_epochs=2)
    ...     trainer.fit(MyModule(), make_loader())
    ...     return trainer.callback_metrics
    >>> metrics = launch(train, nproc_per_node=2)  # doctest: +SKIP
    """
    if nproc_per_node < 1:
        raise ValueError("nproc_per_node must be at least 1")
    payload = _dumps((fn, args, kwargs), fn)
    threads = threads_per_process or max(1, (os.cpu_count() or 1) // nproc_per_node)
    with tempfile.TemporaryDirectory(prefix="gpulayer-launch-") as tmp:
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port or free_port()),
            "WORLD_SIZE": str(nproc_per_node),
            "LOCAL_WORLD_SIZE": str(nproc_per_node),
            "GROUP_RANK": "0",
        }
        try:
            # torch neither annotates nor re-exports start_processes in its stubs
            mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
                _run_rank,
                args=(payload, env, threads, tmp),
                nprocs=nproc_per_node,
                join=True,
                start_method=start_method,
            )
        except ProcessException as e:
            raise _launch_error(e, Path(tmp), nproc_per_node) from None
        with open(Path(tmp) / _RESULT_FILE, "rb") as f:
            result: T = cloudpickle.load(f)
        return result


def _dumps(obj: Any, fn: Callable[..., Any]) -> bytes:
    """cloudpickle ``obj``, carrying ``fn``'s module by value unless it is installed."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    by_value = module is not None and module.__name__ != "__main__" and not _installed(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        data: bytes = cloudpickle.dumps(obj)
        return data
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _installed(module: Any) -> bool:
    """True for modules of installed packages (and of gpulayer and torch themselves)."""
    if module.__name__.split(".")[0] in ("gpulayer", "torch"):
        return True
    path = getattr(module, "__file__", None) or ""
    return "site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix)


def _run_rank(rank: int, payload: bytes, env: dict[str, str], threads: int, tmp: str) -> None:
    """Entry point of each spawned rank (``mp.start_processes`` passes ``rank`` first)."""
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(threads)
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        result = fn(*args, **kwargs)
    except BaseException:
        Path(tmp, _ERROR_FILE.format(rank=rank)).write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        with open(Path(tmp) / _RESULT_FILE, "wb") as f:
            cloudpickle.dump(result, f)


def _launch_error(e: ProcessException, tmp: Path, nprocs: int) -> LaunchError:
    """The failing rank's own traceback when it left one, else torch's report.

    The rank that failed first is the cause: the others usually fail after it, in
    a collective whose peer went away, and may be reported to us first."""
    files = {r: tmp / _ERROR_FILE.format(rank=r) for r in range(nprocs)}
    failed = sorted((p.stat().st_mtime_ns, r) for r, p in files.items() if p.exists())
    rank = failed[0][1] if failed else e.error_index
    path = tmp / _ERROR_FILE.format(rank=rank)
    remote = path.read_text() if path.exists() else str(e)
    last = remote.strip().splitlines()[-1] if remote.strip() else type(e).__name__
    return LaunchError(
        f"rank {rank} of {nprocs} failed: {last}\n\n{remote}", rank=rank, remote_traceback=remote
    )
