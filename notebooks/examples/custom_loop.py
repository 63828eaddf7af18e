"""A training loop written by hand, with Runtime doing the distributed plumbing.

No Trainer: :class:`gpulayer.pytorch.Runtime` says where this process sits
(rank, world size, device), creates the process group under ``torchrun`` (or
``--nproc N``, which uses :func:`gpulayer.pytorch.launch`), and its collectives
average the loss over ranks. The same file runs as one process, under
``torchrun --nproc-per-node 2 notebooks/examples/custom_loop.py``, and on a
gpulayer worker.

    python notebooks/examples/custom_loop.py
    python notebooks/examples/custom_loop.py --nproc 2
    python notebooks/examples/custom_loop.py --tiny
"""

import argparse

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpulayer.pytorch import Runtime, launch, move_to_device


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).long()
    return TensorDataset(x, y)


def train(epochs: int, n: int) -> float:
    """Train on this rank's shard; return the last epoch's loss averaged over ranks."""
    runtime = Runtime.from_env()
    runtime.init()  # a no-op in a world of one
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    model.to(runtime.device)
    if runtime.is_distributed:
        ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    data = make_data(n)
    sampler = DistributedSampler(data, num_replicas=runtime.world_size, rank=runtime.rank)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        # Summed on the device: no host synchronisation inside the loop.
        total = torch.zeros(2, device=runtime.device)
        for batch in loader:
            x, y = move_to_device(batch, runtime.device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach() * len(y), torch.tensor(len(y.float()))])
        runtime.all_reduce(total, "sum")
        mean = (total[0] / total[1]).item()
        if runtime.is_main:
            print(f"epoch {epoch + 1}/{epochs}  loss {mean:.4f}  (world of {runtime.world_size})")
    return mean


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps, for tests")
    parser.add_argument("--nproc", type=int, default=1, help="local DDP processes (via launch)")
    args = parser.parse_args(argv)
    epochs, n = (2, 128) if args.tiny else (10, 4096)
    if args.nproc > 1:
        return launch(train, epochs, n, nproc_per_node=args.nproc)
    return train(epochs, n)


if __name__ == "__main__":
    main()
