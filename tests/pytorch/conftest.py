"""Tiny models and data for the gpulayer.pytorch tests (CPU, a few ms per epoch)."""

from collections.abc import Callable

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.pytorch import Module


class Regression(Module):
    """y = x·w + b with an MSE loss (a mean, so accumulation can divide it)."""

    def __init__(self, features: int = 4, lr: float = 0.1, scheduler: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Linear(features, 1)
        self.lr, self.scheduler = lr, scheduler

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/loss", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return self(x)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if not self.scheduler:
            return opt
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def make_data(n: int = 64, features: int = 4, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.arange(1.0, features + 1).unsqueeze(1)
    y = x @ w + 0.5 + 0.01 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


@pytest.fixture
def gl_regression() -> type[Regression]:
    """The tiny regression Module class."""
    return Regression


@pytest.fixture
def gl_loader() -> Callable[..., DataLoader]:
    """``gl_loader(n=64, batch_size=16, shuffle=False, seed=0)``: a DataLoader of make_data."""

    def make(n: int = 64, batch_size: int = 16, shuffle: bool = False, seed: int = 0):
        return DataLoader(make_data(n, seed=seed), batch_size=batch_size, shuffle=shuffle)

    return make


@pytest.fixture(autouse=True)
def _gl_clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No test sees a real job's artifacts/metrics variables or a launcher's world."""
    for var in ("GPULAYER_ARTIFACTS", "GPULAYER_METRICS_FILE", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
