"""Logged metrics: when they are read, what the sinks get, the JSON-lines file."""

import json
import sys

import pytest
import torch

from gpulayer.pytorch import JsonlSink, MetricRecord, Trainer


class ListSink:
    def __init__(self) -> None:
        self.records: list[MetricRecord] = []
        self.closed = False

    def write(self, record: MetricRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        self.closed = True


def test_step_metrics_are_reported_every_n_steps_and_at_epoch_end(gl_regression, gl_loader) -> None:
    sink = ListSink()
    trainer = Trainer(max_epochs=2, log_every_n_steps=3, metric_sinks=[sink],
                      enable_progress_bar=False)  # fmt: skip
    trainer.fit(gl_regression(), gl_loader(n=80))  # 5 batches per epoch
    assert [step for step, _ in trainer.history] == [3, 5, 6, 9, 10]
    assert [(r.step, r.epoch) for r in sink.records] == [(3, 0), (5, 0), (6, 1), (9, 1), (10, 1)]
    assert sink.closed and set(trainer.logged_metrics) == {"train/loss"}
    assert trainer.progress_bar_metrics == trainer.logged_metrics  # logged with prog_bar=True


def test_the_loop_reads_the_device_only_at_log_points(
    gl_regression, gl_loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = []
    for name in ("item", "tolist", "__float__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            # The DataLoader draws a CPU seed per epoch; that is not the training loop.
            if "torch/utils/data" not in sys._getframe(1).f_code.co_filename:
                reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    trainer = Trainer(max_epochs=1, log_every_n_steps=4, enable_progress_bar=True)
    trainer.fit(gl_regression(), gl_loader(n=128))  # 8 steps: log points after 4 and 8
    assert reads == ["tolist", "tolist"]


def test_on_step_and_on_epoch_suffixes_reductions_and_weights(gl_regression, gl_loader) -> None:
    class Logs(gl_regression):
        def training_step(self, batch, batch_idx):
            self.log("train/both", float(batch_idx), on_step=True, on_epoch=True)
            self.log("train/peak", torch.tensor(float(batch_idx)), reduce="max", on_epoch=True)
            self.log("train/weighted", float(batch_idx), on_step=False, on_epoch=True,
                     batch_size=batch_idx + 1)  # fmt: skip
            return super().training_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1, log_every_n_steps=1, enable_progress_bar=False)
    trainer.fit(Logs(), gl_loader(n=48))  # batch_idx 0, 1, 2
    metrics = trainer.callback_metrics
    assert metrics["train/both_step"] == 2.0 and metrics["train/both_epoch"] == 1.0
    assert metrics["train/both"] == 1.0  # the latest of the two
    assert metrics["train/peak_epoch"] == 2.0
    assert metrics["train/weighted"] == pytest.approx((0 * 1 + 1 * 2 + 2 * 3) / 6)


def test_a_tensor_that_is_not_a_scalar_is_refused(gl_regression, gl_loader) -> None:
    class Bad(gl_regression):
        def training_step(self, batch, batch_idx):
            self.log("train/vec", torch.ones(3))
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=r"log a scalar, not a tensor of shape \(3,\)"):
        Trainer(max_epochs=1, enable_progress_bar=False).fit(Bad(), gl_loader(n=16))


def test_metrics_file_gets_one_json_line_per_log_point(
    gl_regression, gl_loader, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sub" / "metrics.jsonl"
    monkeypatch.setenv("GPULAYER_METRICS_FILE", str(path))
    trainer = Trainer(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False)
    trainer.fit(gl_regression(), gl_loader(n=64), gl_loader(n=16))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["epoch"], sorted(r["metrics"])) for r in lines] == [
        (2, 0, ["train/loss"]),
        (4, 0, ["train/loss"]),
        (4, 0, ["val/loss"]),
        (6, 1, ["train/loss"]),
        (8, 1, ["train/loss"]),
        (8, 1, ["val/loss"]),
    ]
    assert {r["rank"] for r in lines} == {0}
    assert all(isinstance(r["ts"], float) for r in lines)
    assert lines[-1]["metrics"]["val/loss"] == trainer.callback_metrics["val/loss"]


def test_jsonl_sink_appends_and_reopens(tmp_path) -> None:
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.write(MetricRecord(1, 0, 0, {"a": 1.0}, ts=5.0))
    sink.close()
    sink.write(MetricRecord(2, 0, 0, {"a": float("nan")}, ts=6.0))
    sink.close()
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert lines[0] == '{"step": 1, "epoch": 0, "rank": 0, "ts": 5.0, "metrics": {"a": 1.0}}'
    assert json.loads(lines[1])["metrics"]["a"] != json.loads(lines[1])["metrics"]["a"]  # NaN
