"""``gpulayer demo`` counts a skipped step as skipped, never as passed."""

import pytest

from gpulayer.cli import demo


def test_a_skipped_step_is_reported_as_skipped() -> None:
    results: list[bool | str] = [True, True, True, True, "torch is not installed here"]
    assert demo.summary(results) == (
        "4/4 steps behaved as expected, 1 skipped: torch is not installed here"
    )
    assert demo.summary([True, False]) == "1/2 steps behaved as expected"


def test_a_step_that_cannot_run_here_is_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    def needs_a_gpu() -> bool:
        raise demo.Skipped("no GPU here")

    assert demo.run_step("5. something", needs_a_gpu) == "no GPU here"
    assert "skipped: no GPU here" in capsys.readouterr().out
