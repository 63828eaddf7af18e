"""Linear regression with gpulayer.pytorch: the smallest complete Trainer example.

Fits ``y = 3·x₁ - 2·x₂ + 0.5`` from noisy samples, validates every epoch, stops
early when the validation loss stops improving, keeps the best checkpoint, and
prints the learned weights.

    python notebooks/examples/linear_regression.py           # a few seconds on a CPU
    python notebooks/examples/linear_regression.py --tiny    # a smoke run
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset, random_split

from gpulayer.pytorch import EarlyStopping, ModelCheckpoint, Module, Trainer


class LinearRegression(Module):
    def __init__(self, features: int = 2, lr: float = 0.05) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, 1)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def make_data(n: int) -> TensorDataset:
    x = torch.randn(n, 2)
    y = x @ torch.tensor([[3.0], [-2.0]]) + 0.5 + 0.1 * torch.randn(n, 1)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps, for tests")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    train, val = random_split(make_data(256 if args.tiny else 4096), [0.8, 0.2])
    trainer = Trainer(
        max_epochs=2 if args.tiny else 30,
        callbacks=[
            EarlyStopping("val/loss", patience=3, min_delta=1e-4),
            ModelCheckpoint(monitor="val/loss", save_top_k=1),
        ],
        log_every_n_steps=10,
    )
    model = LinearRegression()
    trainer.fit(
        model, DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=256)
    )
    w, b = model.linear.weight.detach().squeeze().tolist(), model.linear.bias.item()
    print(f"learned y = {w[0]:.3f}·x1 + {w[1]:.3f}·x2 + {b:.3f}  (true: 3, -2, 0.5)")
    print(f"validation loss {trainer.callback_metrics['val/loss']:.4f}")
    return trainer.callback_metrics


if __name__ == "__main__":
    main()
