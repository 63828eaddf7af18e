"""The one progress display (tqdm.auto): counts, bytes, start-up steps, and silence
where nobody watches."""

import io

from gpulayer.notebook import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def final(text: str) -> str:
    """The last state a terminal shows (after the last carriage return)."""
    return text.rstrip("\n").rsplit("\r", 1)[-1]


def test_a_bar_counts_to_its_total_in_a_terminal() -> None:
    out = Terminal()
    bar = progress.bar(5, "square", stream=out, unit="call")
    bar.update(2)
    bar.update(3)
    bar.close()
    assert final(out.getvalue()).startswith("square: 100%")
    assert "5/5" in final(out.getvalue()) and "call/s" in final(out.getvalue())


def test_no_bar_where_nobody_watches_unless_asked() -> None:
    quiet = io.StringIO()  # a file or CI log, not a terminal
    bar = progress.bar(3, "square", stream=quiet)
    bar.update(3)
    bar.close()
    assert quiet.getvalue() == ""
    asked = io.StringIO()
    progress.bar(3, "square", want=True, stream=asked).close()
    assert "0/3" in asked.getvalue()
    refused = Terminal()
    progress.bar(3, "square", want=False, stream=refused).close()
    assert refused.getvalue() == ""
    empty = Terminal()
    progress.bar(0, "nothing to do", stream=empty).close()
    assert empty.getvalue() == ""


def test_the_old_progress_auto_still_counts() -> None:
    bar = progress.Progress.auto(4, "map", want=False)
    bar.update(4)
    bar.close()  # a disabled bar takes both and draws nothing


def test_a_transfer_callback_shows_bytes_and_closes_at_the_end(monkeypatch) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    report = progress.transfer("artifacts", want=True)
    report(512 * 1024, 3 * 1024 * 1024)  # the size arrives with the first report
    report(3 * 1024 * 1024, 3 * 1024 * 1024)
    shown = final(out.getvalue())
    assert shown.startswith("artifacts: 100%") and "3.00M/3.00M" in shown
    assert out.getvalue().endswith("\n")  # closed: the line is finished


def test_start_up_steps_name_what_is_ready_and_what_it_waits_for(monkeypatch) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    done = progress.steps(["control plane", "workers"], "starting gpulayer", want=True)
    done("control plane")
    assert "control plane ready, waiting for workers" in out.getvalue()
    assert "1/2" in final(out.getvalue())
    done("workers")
    assert "2/2" in out.getvalue()
