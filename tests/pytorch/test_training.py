"""What a fit computes: accumulation, resume, precision, evaluation results, stopping."""

import copy
import math

import pytest
import torch
from torch.utils.data import DataLoader

from gpulayer.pytorch import ModelCheckpoint, Trainer


def _fit(module, loader, ckpt_path=None, **options):
    trainer = Trainer(enable_progress_bar=False, **options)
    return trainer.fit(module, loader, ckpt_path=ckpt_path)


def test_accumulating_4_batches_of_8_equals_one_batch_of_32(gl_regression, gl_loader) -> None:
    torch.manual_seed(0)
    big, small = gl_regression(lr=0.05), gl_regression(lr=0.05)
    small.load_state_dict(big.state_dict())
    start = copy.deepcopy(big.state_dict())
    _fit(big, gl_loader(n=32, batch_size=32), max_steps=1)
    _fit(small, gl_loader(n=32, batch_size=8), max_steps=1, accumulate_grad_batches=4)
    for name, value in big.state_dict().items():
        assert not torch.equal(value, start[name])  # the step did change something
        torch.testing.assert_close(small.state_dict()[name], value, rtol=1e-5, atol=1e-6)


def _dropout_regression(cls):
    """With dropout, so a resumed run must also restore the random stream."""

    class WithDropout(cls):
        def __init__(self):
            super().__init__(scheduler=True)
            self.drop = torch.nn.Dropout(0.2)

        def forward(self, x):
            return self.net(self.drop(x))

    return WithDropout


def test_resume_at_an_epoch_boundary_continues_the_same_run(
    gl_regression, gl_loader, tmp_path
) -> None:
    model_cls = _dropout_regression(gl_regression)
    torch.manual_seed(1)
    straight = model_cls()
    _fit(straight, gl_loader(shuffle=True), max_epochs=4)

    torch.manual_seed(1)
    first = model_cls()
    _fit(first, gl_loader(shuffle=True), max_epochs=2, callbacks=[ModelCheckpoint(tmp_path)])
    torch.manual_seed(123)  # whatever happens in between must not matter
    resumed = model_cls()
    trainer = _fit(resumed, gl_loader(shuffle=True), max_epochs=4,
                   ckpt_path=tmp_path / "last.ckpt")  # fmt: skip
    assert (trainer.current_epoch, trainer.global_step) == (4, 16)
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0)


def test_resume_from_the_middle_of_an_epoch(gl_regression, gl_loader, tmp_path) -> None:
    model_cls = _dropout_regression(gl_regression)
    torch.manual_seed(2)
    straight = model_cls()
    _fit(straight, gl_loader(shuffle=True), max_epochs=2)

    torch.manual_seed(2)
    first = model_cls()
    interrupted = _fit(first, gl_loader(shuffle=True), max_epochs=2, max_steps=3)
    interrupted.save_checkpoint(tmp_path / "mid.ckpt")  # epoch 0, 3 of 4 batches done
    resumed = model_cls()
    _fit(resumed, gl_loader(shuffle=True), max_epochs=2, ckpt_path=tmp_path / "mid.ckpt")
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0)


def test_bf16_mixed_runs_under_autocast_on_cpu(gl_regression, gl_loader) -> None:
    seen = []

    class Probe(gl_regression):
        def training_step(self, batch, batch_idx):
            seen.append(self(batch[0]).dtype)
            return super().training_step(batch, batch_idx)

    module = Probe()
    trainer = _fit(module, gl_loader(), max_epochs=2, precision="bf16-mixed")
    assert set(seen) == {torch.bfloat16}
    assert math.isfinite(trainer.callback_metrics["train/loss"])
    assert module.net.weight.dtype == torch.float32  # the parameters stay float32


def test_16_mixed_scales_the_loss_and_still_trains(gl_regression, gl_loader) -> None:
    module = gl_regression(lr=0.01)
    trainer = _fit(module, gl_loader(), max_epochs=3, precision="16-mixed", log_every_n_steps=1)
    losses = [m["train/loss"] for _, m in trainer.history]
    assert trainer._precision.scaler is not None
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be"):
        Trainer(max_epochs=1, precision="8-bit")


def test_validate_test_predict_return_what_was_computed(gl_regression, gl_loader) -> None:
    module = gl_regression()
    loader = gl_loader(n=32, batch_size=8)
    trainer = Trainer(max_epochs=1, enable_progress_bar=False)
    x, y = loader.dataset.tensors
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(module(x), y).item()
    assert trainer.validate(module, loader) == {"val/loss": pytest.approx(expected, rel=1e-5)}
    assert trainer.test(module, loader) == {"test/loss": pytest.approx(expected, rel=1e-5)}
    predictions = trainer.predict(module, loader)
    assert len(predictions) == 4 and not predictions[0].requires_grad
    torch.testing.assert_close(torch.cat(predictions), module(x).detach())
    assert module.training is False  # evaluation leaves the module in eval mode


def test_validate_from_a_checkpoint(gl_regression, gl_loader, tmp_path) -> None:
    trained = gl_regression()
    trainer = _fit(trained, gl_loader(), max_epochs=3)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    fresh = gl_regression()
    before = Trainer(max_epochs=1, enable_progress_bar=False).validate(fresh, gl_loader())
    after = Trainer(max_epochs=1, enable_progress_bar=False).validate(
        fresh, gl_loader(), ckpt_path=tmp_path / "m.ckpt"
    )
    assert after["val/loss"] < before["val/loss"]
    torch.testing.assert_close(fresh.net.weight, trained.net.weight)


def test_max_steps_stops_in_the_middle_of_an_epoch(gl_regression, gl_loader) -> None:
    trainer = _fit(gl_regression(), gl_loader(), max_epochs=5, max_steps=6)
    assert (trainer.global_step, trainer.current_epoch, trainer.batches_done) == (6, 1, 2)


def test_a_step_scheduler_and_gradient_clipping(gl_regression, gl_loader) -> None:
    class Clipped(gl_regression):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def on_before_optimizer_step(self, optimizer):
            norms.append(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()]))

    norms: list[torch.Tensor] = []
    trainer = _fit(Clipped(), gl_loader(), max_steps=3, gradient_clip_val=0.5)
    assert all(n.item() <= 0.5 + 1e-5 for n in norms) and len(norms) == 3
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.125)


def test_a_validation_every_n_batches(gl_regression, gl_loader) -> None:
    trainer = Trainer(max_epochs=1, val_check_interval=0.5, enable_progress_bar=False)
    trainer.fit(gl_regression(), gl_loader(), gl_loader(n=16))
    assert [step for step, m in trainer.history if "val/loss" in m] == [2, 4]


def test_bad_settings_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="max_epochs or max_steps"):
        Trainer()
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Trainer(max_epochs=1, val_check_interval=1.5)
    with pytest.raises(TypeError, match=r"gpulayer\.pytorch\.Module"):
        Trainer(max_epochs=1).fit(torch.nn.Linear(1, 1), DataLoader([]))  # type: ignore[arg-type]
