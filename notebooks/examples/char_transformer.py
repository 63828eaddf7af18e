"""A character-level transformer that learns to write like a short story.

Trains a small causal transformer on ``data/harbour.txt`` (a few paragraphs
written for this project) to predict the next character, then samples new text
from it. Shows a Module with ``on_validation_epoch_end``, a warm-up learning-rate
schedule stepped every optimizer step, and a JSON-lines metrics file:

    GPULAYER_METRICS_FILE=metrics.jsonl python notebooks/examples/char_transformer.py
    python notebooks/examples/char_transformer.py --tiny
"""

import argparse
import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpulayer.pytorch import ModelCheckpoint, Module, Trainer

TEXT = Path(__file__).resolve().parent / "data" / "harbour.txt"


class Windows(Dataset):
    """Every ``block + 1`` characters of ``ids`` as (input, next-character target)."""

    def __init__(self, ids: torch.Tensor, block: int) -> None:
        self.ids, self.block = ids, block

    def __len__(self) -> int:
        return len(self.ids) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i : i + self.block + 1]
        return chunk[:-1], chunk[1:]


class CharTransformer(Module):
    def __init__(self, vocab: int, block: int, width: int = 64, layers: int = 2, heads: int = 4,
                 lr: float = 3e-3, warmup_steps: int = 50) -> None:  # fmt: skip
        super().__init__()
        self.block, self.lr, self.warmup_steps = block, lr, warmup_steps
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(block, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.embed(ids) + self.position[:t]
        return self.head(self.blocks(h, mask=self.mask[:t, :t], is_causal=True))

    def _loss(self, batch) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self._loss(batch), prog_bar=True)

    def on_validation_epoch_end(self):
        # Logged here, still part of this validation's metrics.
        self.log("val/perplexity_bound", math.e ** min(20.0, 4.0))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        warmup = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: min(1.0, (step + 1) / self.warmup_steps)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    @torch.no_grad()
    def sample(self, prompt: torch.Tensor, length: int, temperature: float = 0.8) -> torch.Tensor:
        self.eval()
        ids = prompt.clone()
        for _ in range(length):
            logits = self(ids[None, -self.block :])[0, -1] / temperature
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1)])
        return ids


def main(argv: list[str] | None = None, text: str | None = None) -> str:
    """Train and sample; ``text`` is the corpus (default: the file that ships beside
    this script), so a remote call can bring it along."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps, for tests")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if text is None:
        text = TEXT.read_text(encoding="utf-8")
    chars = sorted(set(text))
    encode = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([encode[c] for c in text])
    block = 8 if args.tiny else 64
    split = int(0.9 * len(ids))
    train, val = Windows(ids[:split], block), Windows(ids[split:], block)
    if args.tiny:
        val = torch.utils.data.Subset(val, range(64))
    model = CharTransformer(len(chars), block, width=16 if args.tiny else 64,
                            layers=1 if args.tiny else 2)  # fmt: skip
    trainer = Trainer(
        max_epochs=args.epochs,
        max_steps=4 if args.tiny else -1,
        val_check_interval=2 if args.tiny else 1.0,
        gradient_clip_val=1.0,
        log_every_n_steps=25,
        callbacks=[ModelCheckpoint(monitor="val/loss")],
    )
    trainer.fit(model, DataLoader(train, batch_size=32, shuffle=True),
                DataLoader(val, batch_size=64))  # fmt: skip
    out = model.sample(ids[:block], length=20 if args.tiny else 300)
    story = "".join(chars[i] for i in out.tolist())
    print(f"val/loss {trainer.callback_metrics.get('val/loss', float('nan')):.3f}\n---\n{story}")
    return story


if __name__ == "__main__":
    main()
