"""The Trainer's progress bar (tqdm): what a terminal and a job's log show while fitting."""

import io
import re

from gpulayer.pytorch import ProgressBar, Runtime, Trainer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fit(module, loader, bar: ProgressBar, epochs: int = 2) -> Trainer:
    trainer = Trainer(max_epochs=epochs, log_every_n_steps=2, callbacks=[bar])
    trainer.fit(module, loader)
    return trainer


def test_a_job_log_gets_whole_lines_with_epoch_batches_step_and_metrics(
    gl_regression, gl_loader
) -> None:
    out = io.StringIO()  # not a terminal: "auto" picks whole lines
    fit(gl_regression(), gl_loader(n=64), ProgressBar(log_every_seconds=3600, stream=out))
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    # Only the epoch ends are due within an hour: one line each, the epoch complete.
    assert len(lines) == 2, lines
    assert re.match(r"epoch 1/2: 4/4 \[.*it/s, step 4, train/loss \d", lines[0]), lines[0]
    assert lines[1].startswith("epoch 2/2: 4/4 [") and "step 8" in lines[1]


def test_a_terminal_gets_one_line_redrawn_in_place_and_one_per_epoch(
    gl_regression, gl_loader
) -> None:
    out = Terminal()
    fit(gl_regression(), gl_loader(n=64), ProgressBar(refresh_seconds=0, stream=out), epochs=3)
    text = out.getvalue()
    assert "\r" in text  # redrawn in place
    finals = [line.rsplit("\r", 1)[-1] for line in text.split("\n") if line.strip()]
    assert [line.split(":")[0] for line in finals] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert all("4/4" in line and "train/loss" in line for line in finals)


def test_nothing_is_shown_when_disabled_or_off_the_main_rank(
    gl_regression, gl_loader, capsys, monkeypatch
) -> None:
    Trainer(max_epochs=1, enable_progress_bar=False).fit(gl_regression(), gl_loader(n=32))
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(Runtime, "is_main", property(lambda self: False))  # rank 1 of 2
    out = Terminal()
    fit(gl_regression(), gl_loader(n=32), ProgressBar(stream=out), epochs=1)
    assert out.getvalue() == ""
