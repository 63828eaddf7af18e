"""Data-parallel training with gpulayer.pytorch under torchrun (or gpulayer's direct launcher).

Each rank trains a small linear model on its shard (``DistributedSampler``); DDP
averages the gradients, so every rank ends with the same parameters. Rank 0 logs
``train/loss`` (gpulayer ships it to the control plane as training metrics).
Every rank prints ``checksum <value>`` of its parameters at the end.

    torchrun --nproc-per-node 2 notebooks/examples/ddp_train.py
    gpulayer submit --nodes 2 --nproc-per-node 2 -- python ddp_train.py

``--hold S`` keeps the ranks alive (in collectives) for S seconds after training,
each having written its pid to ``$DDP_PID_DIR/rank<R>.pid``: tests kill one.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpulayer.pytorch import Module, Trainer


class Linear(Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(512, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]]) + 0.25
    data = TensorDataset(x, y)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    sampler = DistributedSampler(data, world, rank, seed=0) if world > 1 else None
    loader = DataLoader(data, batch_size=32, sampler=sampler, shuffle=sampler is None)
    torch.manual_seed(rank + 1)  # different initial weights: DDP makes them equal
    model = Linear()
    trainer = Trainer(max_epochs=args.epochs, log_every_n_steps=2, enable_progress_bar=False)
    trainer.fit(model, loader)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    print(f"checksum {checksum:.10f}", flush=True)
    if args.hold > 0 and dist.is_initialized():
        pid_dir = Path(os.environ.get("DDP_PID_DIR", "."))
        (pid_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
        end = time.monotonic() + args.hold
        while time.monotonic() < end:
            dist.all_reduce(torch.ones(1))
            time.sleep(0.05)
    if dist.is_initialized():
        # Every rank done first: a rank that tears gloo down while a peer still runs
        # its last steps can abort at exit ("terminate called without an active
        # exception", SIGABRT), failing a job whose training succeeded.
        dist.barrier()
        dist.destroy_process_group()  # a gloo group left at exit aborts the process
    return checksum


if __name__ == "__main__":
    main()
