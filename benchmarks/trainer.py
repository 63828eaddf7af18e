"""Trainer overhead: step time of ``gpulayer.pytorch.Trainer`` against a hand-written loop.

Both train the same MLP (same initial weights) on the same pre-built batches
(a list of tensors, so data loading is out of the picture) with SGD, in this
process. One *sample* is one epoch of ``--steps`` optimizer steps:

hand
    ``zero_grad → forward → cross_entropy → backward → step`` in a plain loop.
trainer
    ``Trainer(max_epochs=1).fit(...)`` with ``training_step`` logging the loss
    (``self.log("train/loss", loss, prog_bar=True)``) every step; the epoch is
    timed from ``on_train_epoch_start`` to ``on_train_epoch_end`` by a callback,
    so it includes every hook, the metric reads at log points (default
    ``log_every_n_steps=50``) and the progress bar (writing to ``/dev/null`` in
    "log" mode) but not ``fit``'s one-off setup, which is reported apart.

Samples of the variants are interleaved (hand, trainer, hand, trainer, ...,
with the order alternating) so drift in machine speed hits both alike; the
reported figure is the median per-step time and the ratio of medians. It
measures and reports; it never asserts. Run it as::

    .venv/bin/python benchmarks/trainer.py --repeats 15 --steps 200
"""

import argparse
import copy
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import gpulayer
from gpulayer.pytorch import Callback, Module, ProgressBar, Trainer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "trainer.json"
GOAL_RATIO = 1.03

#: name -> (input features, hidden width, hidden layers, classes, batch size)
MODELS = {
    "mlp-small": (32, 64, 2, 10, 32),
    "mlp-medium": (128, 256, 3, 10, 64),
}


def build_net(features: int, width: int, layers: int, classes: int) -> nn.Module:
    """An MLP with ReLU between ``layers`` hidden layers."""
    parts: list[nn.Module] = [nn.Linear(features, width), nn.ReLU()]
    for _ in range(layers - 1):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts, nn.Linear(width, classes))


def make_batches(steps: int, features: int, classes: int, batch: int) -> list[tuple[Any, Any]]:
    """``steps`` random ``(x, y)`` classification batches."""
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(batch, features, generator=g),
            torch.randint(0, classes, (batch,), generator=g),
        )
        for _ in range(steps)
    ]


class Classifier(Module):
    """The benchmark's Module: the same net, loss and optimizer as the hand loop."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def _clocks() -> tuple[float, float]:
    """(wall, this process's CPU) seconds."""
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clocks()
    return wall - start[0], cpu - start[1]


class EpochTimer(Callback):
    """Times the training epoch from its first hook to its last (wall and CPU)."""

    def __init__(self) -> None:
        self.seconds = (0.0, 0.0)
        self._t0 = (0.0, 0.0)

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        self._t0 = _clocks()

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        self.seconds = _since(self._t0)


def hand_epoch(net: nn.Module, batches: list[tuple[Any, Any]]) -> tuple[float, float]:
    """One epoch of the hand-written loop; (wall, CPU) seconds."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net.train()
    t0 = _clocks()
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    return _since(t0)


def trainer_epoch(
    net: nn.Module, batches: list[tuple[Any, Any]], sink: Any
) -> tuple[tuple[float, float], float]:
    """One ``fit`` of one epoch; ((wall, CPU) epoch seconds, whole ``fit`` wall seconds)."""
    timer = EpochTimer()
    progress = ProgressBar(mode="log", stream=sink)
    trainer = Trainer(max_epochs=1, devices="cpu", callbacks=[timer, progress])
    t0 = time.perf_counter()
    trainer.fit(Classifier(net), batches)
    return timer.seconds, time.perf_counter() - t0


def run_model(name: str, steps: int, repeats: int, sink: Any) -> dict[str, Any]:
    """Interleaved samples of both variants for one model; per-step ms and the ratio."""
    features, width, layers, classes, batch = MODELS[name]
    batches = make_batches(steps, features, classes, batch)
    torch.manual_seed(0)
    initial = build_net(features, width, layers, classes)
    hand_epoch(copy.deepcopy(initial), batches)  # warm-up: allocator, kernels, imports
    trainer_epoch(copy.deepcopy(initial), batches, sink)
    samples: dict[str, list[tuple[float, float]]] = {"hand": [], "trainer": []}
    setup = []
    for r in range(repeats):
        order = ("hand", "trainer") if r % 2 == 0 else ("trainer", "hand")
        for variant in order:
            net = copy.deepcopy(initial)
            if variant == "hand":
                samples["hand"].append(hand_epoch(net, batches))
            else:
                epoch_s, total_s = trainer_epoch(net, batches, sink)
                samples["trainer"].append(epoch_s)
                setup.append(total_s - epoch_s[0])
    out: dict[str, Any] = {
        "model": name,
        "shape": dict(
            zip(("features", "width", "layers", "classes", "batch"), MODELS[name], strict=True)
        ),
        "steps": steps,
        "repeats": repeats,
        "fit_setup_ms": round(statistics.median(setup) * 1000.0, 2),
    }
    for i, clock in enumerate(("wall", "cpu")):
        hand = [s[i] * 1000.0 / steps for s in samples["hand"]]
        fitted = [s[i] * 1000.0 / steps for s in samples["trainer"]]
        h, t = statistics.median(hand), statistics.median(fitted)
        out[clock] = {
            "hand_step_ms": round(h, 4),
            "trainer_step_ms": round(t, 4),
            "ratio": round(t / h, 4),
            # Pairs ran back to back: their ratio cancels slow drift of the machine.
            "paired_ratio": round(
                statistics.median(b / a for a, b in zip(hand, fitted, strict=True)), 4
            ),
            "overhead_us_per_step": round((t - h) * 1000.0, 1),
            "hand_samples_ms": [round(v, 4) for v in hand],
            "trainer_samples_ms": [round(v, 4) for v in fitted],
        }
    return out


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with the results."""
    try:
        git = ["git", "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True)
        commit = commit.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "gpulayer": gpulayer.__version__,
        "commit": commit,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_1m_before": round(os.getloadavg()[0], 2),
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table of the results."""
    rows = [
        "| model | batch | clock | hand ms/step | trainer ms/step | ratio | paired ratio "
        "| overhead µs/step | fit setup ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for clock in ("wall", "cpu"):
            c = r[clock]
            rows.append(
                f"| {r['model']} | {r['shape']['batch']} | {clock} | {c['hand_step_ms']:.3f} | "
                f"{c['trainer_step_ms']:.3f} | {c['ratio']:.3f} | {c['paired_ratio']:.3f} | "
                f"{c['overhead_us_per_step']:.0f} | {r['fit_setup_ms']:.1f} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the JSON (and a markdown next to it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per sample")
    parser.add_argument("--repeats", type=int, default=15, help="samples per variant")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with open(os.devnull, "w") as sink:
        results = [run_model(name, args.steps, args.repeats, sink) for name in args.models]
    env = environment()
    env["load_1m_after"] = round(os.getloadavg()[0], 2)
    report = {"environment": env, "goal_ratio": GOAL_RATIO, "results": results}
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
