"""A hyperparameter sweep with ``.map``: one remote training run per learning rate.

Trains the linear regression of ``linear_regression.py`` once per learning rate,
each run a call of a ``@gl.remote`` function that the workers run side by side,
and prints the validation loss of each, best first. Needs a cluster: start one
with ``gpulayer up`` (or set ``GPULAYER_URL``/``GPULAYER_TOKEN``), then

    python notebooks/examples/sweep.py            # five learning rates, 20 epochs each
    python notebooks/examples/sweep.py --tiny     # one epoch on a little data
"""

import argparse

import torch
from torch.utils.data import DataLoader, random_split

import gpulayer as gl
from gpulayer.pytorch import Trainer

from linear_regression import LinearRegression, make_data  # the script beside this one  # isort: skip

LEARNING_RATES = [0.3, 0.1, 0.03, 0.01, 0.003]


def fit(lr: float, epochs: int, samples: int) -> dict[str, float]:
    """One run of the sweep (on a worker): train with ``lr``, answer its scores."""
    torch.manual_seed(0)  # the same data and start for every learning rate
    train, val = random_split(make_data(samples), [0.8, 0.2])
    trainer = Trainer(max_epochs=epochs, enable_progress_bar=False, log_every_n_steps=10)
    trainer.fit(
        LinearRegression(lr=lr),
        DataLoader(train, batch_size=32, shuffle=True),
        DataLoader(val, batch_size=256),
    )
    return {"lr": lr, "val/loss": trainer.callback_metrics["val/loss"]}


def sweep(
    rates: list[float], *, epochs: int, samples: int, progress: bool | None = None
) -> list[dict[str, float]]:
    """Run :func:`fit` remotely for every learning rate; answers the scores, best first."""
    remote_fit = gl.remote(fit, name="sweep-fit", env={"OMP_NUM_THREADS": "1"})
    runs = remote_fit.map([(lr, epochs, samples) for lr in rates], star=True, progress=progress)
    return sorted(runs, key=lambda r: r["val/loss"])


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="one short epoch per run, for tests")
    args = parser.parse_args(argv)
    epochs, samples = (1, 256) if args.tiny else (20, 4096)
    results = sweep(LEARNING_RATES, epochs=epochs, samples=samples)
    print(f"{'lr':>8}  val/loss")
    for r in results:
        print(f"{r['lr']:>8g}  {r['val/loss']:.4f}")
    print(f"best lr {results[0]['lr']:g}")
    return results


if __name__ == "__main__":
    main()
