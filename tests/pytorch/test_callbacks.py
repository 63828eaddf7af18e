"""EarlyStopping and ModelCheckpoint on metrics a test controls."""

from pathlib import Path

import pytest
import torch

from gpulayer.pytorch import EarlyStopping, ModelCheckpoint, Trainer
from gpulayer.pytorch import checkpoint as ckpt


@pytest.fixture
def scripted(gl_regression):
    """A module whose validation reports ``values[epoch]`` as ``val/score``."""

    def make(values: list[float]):
        class Scripted(gl_regression):
            def validation_step(self, batch, batch_idx):
                self.log("val/score", values[self.trainer.current_epoch])

        return Scripted()

    return make


def test_early_stopping_stops_after_patience_checks_without_improvement(
    scripted, gl_loader
) -> None:
    stop = EarlyStopping("val/score", mode="min", patience=2)
    trainer = Trainer(max_epochs=20, callbacks=[stop], enable_progress_bar=False)
    # Improves in epochs 0-2, then two epochs (3, 4) without a better value than 3.0.
    trainer.fit(scripted([5, 4, 3, 3.5, 3.2, 1, 1, 1]), gl_loader(n=16), gl_loader(n=16))
    assert stop.stopped_epoch == 4
    assert trainer.current_epoch == 5  # epochs 0..4 ran
    assert stop.best == 3.0


def test_early_stopping_min_delta_and_max_mode(scripted, gl_loader) -> None:
    stop = EarlyStopping("val/score", mode="max", patience=1, min_delta=0.5)
    trainer = Trainer(max_epochs=20, callbacks=[stop], enable_progress_bar=False)
    trainer.fit(scripted([1, 2, 2.2, 9, 9]), gl_loader(n=16), gl_loader(n=16))
    assert stop.stopped_epoch == 2  # +0.2 is below min_delta


def test_early_stopping_names_the_metrics_it_could_use(gl_regression, gl_loader) -> None:
    trainer = Trainer(max_epochs=2, callbacks=[EarlyStopping("val/acc")], enable_progress_bar=False)
    with pytest.raises(KeyError, match=r"'val/acc', which was not logged \(logged: .*val/loss"):
        trainer.fit(gl_regression(), gl_loader(n=16), gl_loader(n=16))


def test_early_stopping_without_validation_checks_at_epoch_end(gl_regression, gl_loader) -> None:
    class Flat(gl_regression):
        def on_train_epoch_end(self):
            pass

        def training_step(self, batch, batch_idx):
            self.log("train/flat", 1.0, on_epoch=True)
            return super().training_step(batch, batch_idx)

    stop = EarlyStopping("train/flat", patience=1)
    trainer = Trainer(max_epochs=10, callbacks=[stop], enable_progress_bar=False)
    trainer.fit(Flat(), gl_loader(n=16))
    assert trainer.current_epoch == 2


def test_model_checkpoint_keeps_the_top_k_and_a_last_in_the_artifacts_dir(
    scripted, gl_loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifacts = tmp_path / "job-artifacts"
    monkeypatch.setenv("GPULAYER_ARTIFACTS", str(artifacts))
    saver = ModelCheckpoint(monitor="val/score", save_top_k=2, filename="e{epoch}-{val/score:.1f}")
    trainer = Trainer(max_epochs=5, callbacks=[saver], enable_progress_bar=False,
                      default_root_dir=tmp_path / "root")  # fmt: skip
    trainer.fit(scripted([3.0, 1.0, 2.0, 0.5, 4.0]), gl_loader(n=16), gl_loader(n=16))
    files = sorted(p.name for p in (artifacts / "checkpoints").iterdir())
    assert files == ["e1-1.0.ckpt", "e3-0.5.ckpt", "last.ckpt"]
    assert saver.best_model_path == str(artifacts / "checkpoints" / "e3-0.5.ckpt")
    assert not (tmp_path / "root").exists()
    last = ckpt.load(artifacts / "checkpoints" / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (4, 5)
    assert ckpt.load(saver.best_model_path)["epoch"] == 3


def test_model_checkpoint_max_mode_and_default_root(scripted, gl_loader, tmp_path: Path) -> None:
    saver = ModelCheckpoint(monitor="val/score", mode="max", save_top_k=1, save_last=False)
    trainer = Trainer(max_epochs=4, callbacks=[saver], enable_progress_bar=False,
                      default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(scripted([1.0, 3.0, 2.0, 0.0]), gl_loader(n=16), gl_loader(n=16))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch=1-step=2.ckpt"]


def test_model_checkpoint_without_monitor_keeps_the_newest(
    gl_regression, gl_loader, tmp_path
) -> None:
    saver = ModelCheckpoint(save_top_k=2, save_last=False)
    trainer = Trainer(max_epochs=3, callbacks=[saver], enable_progress_bar=False,
                      default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(gl_regression(), gl_loader(n=16))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch=1-step=2.ckpt", "epoch=2-step=3.ckpt"]


def test_callback_state_survives_resume(scripted, gl_loader, tmp_path: Path) -> None:
    values = [5.0, 4.0, 6.0, 7.0, 1.0]

    def callbacks():
        return [EarlyStopping("val/score", patience=2),
                ModelCheckpoint(tmp_path, monitor="val/score", save_top_k=1)]  # fmt: skip

    first = callbacks()
    Trainer(max_epochs=3, callbacks=first, enable_progress_bar=False).fit(
        scripted(values), gl_loader(n=16), gl_loader(n=16)
    )
    assert first[0].wait == 1
    again = callbacks()
    trainer = Trainer(max_epochs=10, callbacks=again, enable_progress_bar=False)
    trainer.fit(
        scripted(values), gl_loader(n=16), gl_loader(n=16), ckpt_path=tmp_path / "last.ckpt"
    )
    # The restored wait (1) plus epoch 3 without improvement reaches patience 2.
    assert again[0].stopped_epoch == 3
    assert again[1].best_model_path == str(tmp_path / "epoch=1-step=2.ckpt")


def test_two_callbacks_with_one_state_key_are_refused() -> None:
    with pytest.raises(ValueError, match="state_key"):
        Trainer(max_epochs=1, callbacks=[EarlyStopping("a"), EarlyStopping("a")])


def test_checkpoints_hold_plain_values_and_load_with_weights_only(
    gl_regression, gl_loader, tmp_path: Path
) -> None:
    import numpy  # noqa: F401  (its RNG state is saved when numpy is loaded)

    trainer = Trainer(max_epochs=1, enable_progress_bar=False)
    trainer.fit(gl_regression(scheduler=True), gl_loader(n=16))
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)
    assert loaded["format"] == 1 and "numpy" in loaded["rng"]["now"]
    assert loaded["lr_scheduler"]["last_epoch"] == 1
