"""launch(): DDP over local gloo processes, as torchrun would run it."""

import gc

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpulayer.pytorch import EarlyStopping, LaunchError, Module, Runtime, Trainer, launch


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]]) + 0.1)


class Linear(Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        self.log("train/rank", float(self.trainer.runtime.rank), on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(loader: DataLoader, val: DataLoader) -> tuple[Trainer, Linear]:
    torch.manual_seed(0)
    module = Linear()
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=2, devices="cpu",
                      enable_progress_bar=False, callbacks=[EarlyStopping("val/loss")])  # fmt: skip
    trainer.fit(module, loader, val)
    return trainer, module


def _ddp_fit() -> dict:
    runtime = Runtime.from_env(devices="cpu")
    runtime.init()  # DistributedSampler needs the process group (fit would make it later)
    data = _data()
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    val = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False))
    trainer, module = _fit(loader, val)
    params = torch.cat([p.detach().flatten() for p in module.parameters()])
    gathered = [torch.empty_like(params) for _ in range(runtime.world_size)]
    dist.all_gather(gathered, params)
    return {
        "world_size": runtime.world_size,
        "backend": dist.get_backend(),
        "params": gathered,
        "metrics": trainer.callback_metrics,
        "steps": trainer.global_step,
        # A wrapper kept after fit holds the process group past destroy_process_group,
        # to be torn down at interpreter exit, where gloo can abort a finished job.
        "wrappers_left": sum(type(o) is DistributedDataParallel for o in gc.get_objects()),
    }


def _world() -> dict:
    runtime = Runtime.from_env(devices="cpu")
    return {"rank": runtime.rank, "world": runtime.world_size, "addr": runtime.master_addr}


def test_spawned_ranks_see_a_torchrun_world_and_rank_0_answers() -> None:
    # Spawn (the default) starts fresh interpreters: the function travels by value.
    assert launch(_world, nproc_per_node=2) == {"rank": 0, "world": 2, "addr": "127.0.0.1"}


def test_a_ddp_fit_in_two_processes_ends_with_identical_parameters() -> None:
    # The first optimizer imports torch._dynamo (seconds); do it once here, before forking.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    result = launch(_ddp_fit, nproc_per_node=2, start_method="fork")
    assert (result["world_size"], result["backend"], result["steps"]) == (2, "gloo", 4)
    assert result["wrappers_left"] == 0  # fit let go of DDP (and so of the group)
    rank0, rank1 = result["params"]
    assert torch.equal(rank0, rank1)
    assert result["metrics"]["train/rank"] == 0.5  # averaged over ranks 0 and 1
    # Two ranks x 8 samples per micro-batch = the single-process run with batches of 16.
    trainer, single = _fit(DataLoader(_data(), batch_size=16), DataLoader(_data(), batch_size=32))
    expected = torch.cat([p.detach().flatten() for p in single.parameters()])
    torch.testing.assert_close(rank0, expected, rtol=1e-5, atol=1e-6)
    assert result["metrics"]["val/loss"] == pytest.approx(trainer.callback_metrics["val/loss"])


def _rank_one_fails() -> None:
    runtime = Runtime.from_env(devices="cpu")
    runtime.init()
    if runtime.rank == 1:
        raise ValueError("rank 1 exploded")
    runtime.barrier()  # rank 0 waits here until launch stops it


def test_a_failing_rank_raises_in_the_caller_with_its_traceback() -> None:
    with pytest.raises(
        LaunchError, match=r"rank 1 of 2 failed: ValueError: rank 1 exploded"
    ) as info:
        launch(_rank_one_fails, nproc_per_node=2, start_method="fork")  # fork: no torch import
    assert info.value.rank == 1
    assert "_rank_one_fails" in info.value.remote_traceback


class RankLoss(Linear):
    """Also logs a value that differs by rank: rank r reports r + 1 at every step."""

    def training_step(self, batch, batch_idx):
        self.log("train/own", torch.tensor(float(self.trainer.runtime.rank + 1)))
        return super().training_step(batch, batch_idx)


def _fit_with_rank_metrics(path: str) -> int:
    import os

    os.environ["GPULAYER_METRICS_FILE"] = path
    runtime = Runtime.from_env(devices="cpu")
    runtime.init()
    data = _data(32)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    trainer = Trainer(max_steps=2, log_every_n_steps=1, devices="cpu",
                      enable_progress_bar=False, log_rank_metrics=True)  # fmt: skip
    trainer.fit(RankLoss(), loader)
    return trainer.global_step


def test_log_rank_metrics_writes_every_ranks_own_values_beside_the_reduced_ones(tmp_path):
    import json

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # see the DDP test
    path = tmp_path / "metrics.jsonl"
    assert launch(_fit_with_rank_metrics, str(path), nproc_per_node=2, start_method="fork") == 2
    records = [json.loads(line) for line in path.read_text().splitlines()]
    at_step = {}
    for r in records:
        if "train/own" in r["metrics"]:
            at_step.setdefault(r["step"], {})[r["rank"]] = r["metrics"]["train/own"]
    # Each step: rank 0 says 1, rank 1 says 2, and the reduced record (rank None) the mean.
    assert at_step == {1: {None: 1.5, 0: 1.0, 1: 2.0}, 2: {None: 1.5, 0: 1.0, 1: 2.0}}
