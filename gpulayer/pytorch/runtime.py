"""Where this process sits in a training run: rank, world size and device.

A :class:`Runtime` is read from the variables ``torchrun`` (and
:func:`gpulayer.pytorch.launch`) set for every process::

    RANK  LOCAL_RANK  WORLD_SIZE  LOCAL_WORLD_SIZE  GROUP_RANK  MASTER_ADDR  MASTER_PORT

Without them the process is a world of one. The device is CUDA (the GPU at
``LOCAL_RANK`` among the visible ones), then Apple's MPS, then the CPU. Under a
world of more than one, :meth:`Runtime.init` creates the default process group:
NCCL on CUDA, gloo otherwise.

The collectives here (:meth:`Runtime.all_reduce`, :meth:`Runtime.any`,
:meth:`Runtime.barrier`) are no-ops in a world of one, so code written against a
``Runtime`` runs unchanged in a notebook and under ``torchrun``.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

#: The environment variables a distributed launcher sets for each process.
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def select_device(choice: str | torch.device = "auto", local_rank: int = 0) -> torch.device:
    """The device to train on.

    Parameters
    ----------
    choice
        ``"auto"`` (CUDA, then MPS, then CPU), a device type such as ``"cuda"``,
        ``"mps"`` or ``"cpu"``, or a full device (``"cuda:1"``, a
        :class:`torch.device`).
    local_rank
        Picks the GPU among the visible ones when ``choice`` names no index.

    Raises
    ------
    ValueError
        If the requested device type is not available here.
    """
    if isinstance(choice, torch.device) or (isinstance(choice, str) and ":" in choice):
        return torch.device(choice)
    if choice == "auto":
        if torch.cuda.is_available():
            choice = "cuda"
        elif torch.backends.mps.is_available():
            choice = "mps"
        else:
            choice = "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("devices='cuda' but torch sees no CUDA device")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if choice == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("devices='mps' but MPS is not available")
        return torch.device("mps")
    if choice == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown device {choice!r}: use 'auto', 'cuda', 'mps', 'cpu' or 'cuda:N'")


@dataclass(frozen=True)
class Runtime:
    """This process's place in a (possibly distributed) run.

    Parameters
    ----------
    rank, world_size
        Global rank and number of processes.
    local_rank, local_world_size
        Rank and number of processes on this machine.
    node_rank
        Which machine this is (torchrun's ``GROUP_RANK``).
    device
        Where tensors of this process live.
    master_addr, master_port
        The rendezvous of the process group (``None`` in a world of one).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    master_addr: str | None = None
    master_port: int | None = None

    @classmethod
    def from_env(
        cls, devices: str | torch.device = "auto", env: Mapping[str, str] | None = None
    ) -> "Runtime":
        """Read the launcher's variables (``os.environ`` by default) and pick the device.

        Raises
        ------
        ValueError
            If the variables are inconsistent (a rank outside the world) or the
            device is unavailable.
        """
        env = os.environ if env is None else env
        world_size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
        if not 0 <= rank < world_size:
            raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
        port = env.get("MASTER_PORT")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world_size))),
            node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
            device=select_device(devices, local_rank),
            master_addr=env.get("MASTER_ADDR"),
            master_port=int(port) if port else None,
        )

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that writes files and reports."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when there is more than one process."""
        return self.world_size > 1

    @property
    def backend(self) -> str:
        """The process-group backend for this device: ``"nccl"`` on CUDA, else ``"gloo"``."""
        return "nccl" if self.device.type == "cuda" else "gloo"

    def init(self, timeout_seconds: float = 1800.0) -> bool:
        """Create the default process group if this is a distributed run and none exists.

        Returns
        -------
        bool
            True when this call created the group (the caller may destroy it).
        """
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if not self.is_distributed or dist.is_initialized():
            return False
        dist.init_process_group(
            self.backend,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_seconds),
            device_id=self.device if self.backend == "nccl" else None,
        )
        return True

    def barrier(self) -> None:
        """Wait until every process gets here (no-op in a world of one)."""
        if self._synced():
            dist.barrier()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over all processes in place (``"sum"``, ``"mean"``,
        ``"max"`` or ``"min"``) and return it."""
        if not self._synced():
            return tensor
        dist.all_reduce(tensor, op=_REDUCE_OPS["sum" if op == "mean" else op])
        if op == "mean":
            tensor /= self.world_size
        return tensor

    def any(self, flag: bool) -> bool:
        """True on every process if ``flag`` is true on at least one (one all-reduce).

        Use it for decisions every rank must share, such as stopping early.
        """
        if not self._synced():
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return bool(self.all_reduce(t, "max").item())

    def _synced(self) -> bool:
        return self.is_distributed and dist.is_available() and dist.is_initialized()
