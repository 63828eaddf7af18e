"""The exact order of hooks in a whole fit(), validate(), test() and predict()."""

import inspect

import torch

from gpulayer.pytorch import Callback, Trainer

HOOKS = [
    name
    for name, _ in inspect.getmembers(Callback, inspect.isfunction)
    if name.startswith("on_") or name in ("setup", "teardown")
]


class Recorder(Callback):
    """Records every hook call as ``name`` or ``name(arg)``."""

    def __init__(self) -> None:
        self.calls: list[str] = []


def _recording(name: str):
    def hook(self, trainer, module, *args):
        if name in ("setup", "teardown"):
            self.calls.append(f"{name}({args[0]})")
        elif name in ("on_train_batch_start", "on_validation_batch_start", "on_test_batch_start",
                      "on_predict_batch_start"):  # fmt: skip
            self.calls.append(f"{name}({args[1]})")
        elif name.endswith("_batch_end"):
            self.calls.append(f"{name}({args[2]})")
        else:
            self.calls.append(name)

    return hook


for _name in HOOKS:
    setattr(Recorder, _name, _recording(_name))


def _train_batch(i: int, step: bool) -> list[str]:
    calls = [f"on_train_batch_start({i})", "on_before_backward", "on_after_backward"]
    if step:
        calls.append("on_before_optimizer_step")
    return [*calls, f"on_train_batch_end({i})"]


VALIDATION = [
    "on_validation_start",
    "on_validation_epoch_start",
    "on_validation_batch_start(0)",
    "on_validation_batch_end(0)",
    "on_validation_epoch_end",
    "on_validation_end",
]


def test_fit_calls_every_hook_in_order(gl_regression, gl_loader) -> None:
    rec = Recorder()
    trainer = Trainer(max_epochs=2, callbacks=[rec], enable_progress_bar=False)
    trainer.fit(gl_regression(), gl_loader(n=32), gl_loader(n=16))
    epoch = [
        "on_train_epoch_start",
        *_train_batch(0, step=True),
        *_train_batch(1, step=True),
        *VALIDATION,
        "on_train_epoch_end",
    ]
    assert rec.calls == [
        "setup(fit)",
        "on_fit_start",
        "on_train_start",
        *epoch,
        *epoch,
        "on_train_end",
        "on_fit_end",
        "teardown(fit)",
    ]


def test_accumulation_steps_on_the_last_micro_batch_and_at_epoch_end(
    gl_regression, gl_loader
) -> None:
    rec = Recorder()
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[rec],
                      enable_progress_bar=False)  # fmt: skip
    trainer.fit(gl_regression(), gl_loader(n=48))  # 3 batches: steps after 2 and after 3
    steps = [c for c in rec.calls if c == "on_before_optimizer_step" or "batch_end" in c]
    assert steps == [
        "on_train_batch_end(0)",
        "on_before_optimizer_step",
        "on_train_batch_end(1)",
        "on_before_optimizer_step",
        "on_train_batch_end(2)",
    ]
    assert trainer.global_step == 2


def test_mid_epoch_validation_and_resume_hooks(gl_regression, gl_loader, tmp_path) -> None:
    first = Trainer(max_epochs=1, enable_progress_bar=False, default_root_dir=tmp_path)
    first.fit(gl_regression(), gl_loader(n=32))
    first.save_checkpoint(tmp_path / "a.ckpt")
    rec = Recorder()
    trainer = Trainer(max_epochs=2, val_check_interval=1, callbacks=[rec],
                      enable_progress_bar=False)  # fmt: skip
    trainer.fit(gl_regression(), gl_loader(n=32), gl_loader(n=16), ckpt_path=tmp_path / "a.ckpt")
    assert rec.calls == [
        "setup(fit)",
        "on_load_checkpoint",
        "on_fit_start",
        "on_train_start",
        "on_train_epoch_start",
        *_train_batch(0, step=True),
        *VALIDATION,
        *_train_batch(1, step=True),
        *VALIDATION,
        "on_train_epoch_end",
        "on_train_end",
        "on_fit_end",
        "teardown(fit)",
    ]


def test_validate_test_predict_hooks(gl_regression, gl_loader) -> None:
    rec = Recorder()
    trainer = Trainer(max_epochs=1, callbacks=[rec], enable_progress_bar=False)
    module = gl_regression()
    trainer.validate(module, gl_loader(n=16))
    trainer.test(module, gl_loader(n=16))
    trainer.predict(module, gl_loader(n=16))
    assert rec.calls == [
        "setup(validate)",
        *VALIDATION,
        "teardown(validate)",
        *[c.replace("validation", "test").replace("(validate)", "(test)")
          for c in ["setup(validate)", *VALIDATION, "teardown(validate)"]],
        *[c.replace("validation", "predict").replace("(validate)", "(predict)")
          for c in ["setup(validate)", *VALIDATION, "teardown(validate)"]],
    ]  # fmt: skip


def test_an_exception_reaches_on_exception_and_teardown(gl_regression, gl_loader) -> None:
    class Boom(gl_regression):
        def training_step(self, batch, batch_idx):
            raise ValueError("bad batch")

    rec = Recorder()
    trainer = Trainer(max_epochs=1, callbacks=[rec], enable_progress_bar=False)
    try:
        trainer.fit(Boom(), gl_loader(n=16))
    except ValueError as e:
        assert str(e) == "bad batch"
    else:
        raise AssertionError("fit should have raised")
    assert rec.calls[-3:] == ["on_train_batch_start(0)", "on_exception", "teardown(fit)"]


def test_module_hooks_run_after_the_callbacks(gl_regression, gl_loader) -> None:
    order: list[str] = []

    class Hooked(gl_regression):
        def on_train_epoch_end(self):
            order.append("module")
            self.log("train/extra", torch.tensor(2.0), on_epoch=True)

    class First(Callback):
        def on_train_epoch_end(self, trainer, module):
            order.append("callback")

    trainer = Trainer(max_epochs=1, callbacks=[First()], enable_progress_bar=False)
    trainer.fit(Hooked(), gl_loader(n=16))
    assert order == ["callback", "module"]
    assert trainer.callback_metrics["train/extra"] == 2.0  # logged in a hook, still reported
    assert "Hooked.on_train_epoch_end" in trainer.hook_seconds
