"""A small CNN on synthetic images: where is the bright square?

Each 1×16×16 image is noise with a bright 4×4 square in one of its four
quadrants; the label is the quadrant. The example shows mixed precision
(``--precision bf16-mixed`` works on CPUs too), gradient accumulation, a
learning-rate schedule, and ``test``/``predict`` after ``fit``.

    python notebooks/examples/cnn_synthetic.py
    python notebooks/examples/cnn_synthetic.py --precision bf16-mixed --accumulate 2
    python notebooks/examples/cnn_synthetic.py --tiny
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.pytorch import Module, Trainer


def make_images(n: int, size: int = 16, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    images = 0.3 * torch.randn(n, 1, size, size, generator=g)
    labels = torch.randint(0, 4, (n,), generator=g)
    half = size // 2
    for i, label in enumerate(labels.tolist()):
        top = (label // 2) * half + int(torch.randint(0, half - 4, (1,), generator=g))
        left = (label % 2) * half + int(torch.randint(0, half - 4, (1,), generator=g))
        images[i, 0, top : top + 4, left : left + 4] += 2.0
    return TensorDataset(images, labels)


class QuadrantNet(Module):
    def __init__(self, channels: int = 16, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * channels * 16, 4),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss_and_accuracy(self, batch):
        x, y = batch
        logits = self(x)
        return nn.functional.cross_entropy(logits, y), (logits.argmax(1) == y).float().mean()

    def training_step(self, batch, batch_idx):
        loss, acc = self._loss_and_accuracy(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/accuracy", acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, acc = self._loss_and_accuracy(batch)
        self.log_dict({"val/loss": loss, "val/accuracy": acc}, prog_bar=True)

    def test_step(self, batch, batch_idx):
        loss, acc = self._loss_and_accuracy(batch)
        self.log_dict({"test/loss": loss, "test/accuracy": acc})

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return self(x).argmax(1)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.max_epochs)
        return {"optimizer": opt, "lr_scheduler": sched}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps, for tests")
    parser.add_argument("--precision", default="32", choices=["32", "bf16-mixed", "16-mixed"])
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    n = 64 if args.tiny else 4096
    train, val, test = (
        make_images(n, seed=0),
        make_images(n // 4, seed=1),
        make_images(n // 4, seed=2),
    )
    trainer = Trainer(
        max_epochs=1 if args.tiny else args.epochs,
        precision=args.precision,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=1.0,
        log_every_n_steps=10,
    )
    model = QuadrantNet(channels=4 if args.tiny else 16)
    trainer.fit(
        model, DataLoader(train, batch_size=64, shuffle=True), DataLoader(val, batch_size=256)
    )
    results = trainer.test(model, DataLoader(test, batch_size=256))
    predicted = torch.cat(trainer.predict(model, DataLoader(test, batch_size=256)))
    print(
        f"test accuracy {results['test/accuracy']:.3f}; first predictions {predicted[:8].tolist()}"
    )
    return results


if __name__ == "__main__":
    main()
