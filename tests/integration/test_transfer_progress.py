"""Progress where someone watches (issue 22, finding 7): a workdir's packing and upload,
artifact downloads and ``.map`` calls that wait, drawn by tqdm in a terminal-like
stream; nothing where nobody watches unless asked. A real control plane and worker."""

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import cli, errors
from gpulayer.cluster import LocalCluster

from ..support import until
from .conftest import FAST

MIB = 1024 * 1024


class Terminal(io.StringIO):
    """What tqdm sees as a terminal (it draws there by default)."""

    def isatty(self) -> bool:
        return True


def shown(out: io.StringIO) -> list[str]:
    """Every state the bars drew (tqdm rewrites a line after a carriage return)."""
    return [s.strip() for s in out.getvalue().replace("\r", "\n").splitlines() if s.strip()]


def last(out: io.StringIO, start: str) -> str:
    """The last state of the bar whose description is ``start``."""
    states = [s for s in shown(out) if s.startswith(start)]
    assert states, f"no bar {start!r} in {shown(out)}"
    return states[-1]


@pytest.fixture(scope="module")
def laptop(tmp_path_factory) -> Iterator[LocalCluster]:
    """A control plane and one worker without GPUs and with one task slot."""
    with LocalCluster(tmp_path_factory.mktemp("laptop"), workers=1, slots=1, **FAST) as c:
        yield c


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A workdir with 3 MiB that do not compress (three chunks to send)."""
    d = tmp_path / "work"
    d.mkdir()
    (d / "data.bin").write_bytes(os.urandom(3 * MIB))
    return d


READ_DATA = ["python", "-c", "import os; print(os.path.getsize('data.bin'))"]
KEEP_NOISE = 'head -c 2097152 /dev/urandom > "$GPULAYER_ARTIFACTS/noise.bin"'


def test_a_workdir_upload_and_a_download_draw_byte_bars_in_a_terminal(
    laptop: LocalCluster, work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    with laptop.connection() as conn:
        job = gl.submit(READ_DATA, workdir=work, connection=conn)
        packing = last(out, f"packing {work}")
        assert "3.0" in packing and "M" in packing  # ~3 MiB packed (unknown total: no %)
        uploading = last(out, f"uploading {work}: 100%")
        assert "3.00M/3.00M" in uploading
        assert job.wait(timeout=120).state == "succeeded"
        assert "3145728" in job.logs()  # what was uploaded is what the task read

        keeper = gl.submit(KEEP_NOISE, connection=conn)
        assert keeper.wait(timeout=120).state == "succeeded"
        (path,) = keeper.download(tmp_path / "dl")
    assert path.stat().st_size == 2 * MIB
    done = last(out, f"downloading job {keeper.id}'s artifacts: 100%")
    assert "2.00M/2.00M" in done


def test_no_bar_where_nobody_watches_unless_asked(
    laptop: LocalCluster, work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = io.StringIO()  # a script's output going to a file or CI: not a terminal
    monkeypatch.setattr("sys.stderr", log)
    with laptop.connection() as conn:
        job = gl.submit(READ_DATA, workdir=work, connection=conn)
        assert job.wait(timeout=120).state == "succeeded"
        assert log.getvalue() == ""
        gl.submit(READ_DATA, workdir=work, connection=conn, progress=True)
        assert "100%" in last(log, f"uploading {work}")  # asked for: drawn anyway
        terminal = Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        keeper = gl.submit(KEEP_NOISE, connection=conn, progress=False)
        assert keeper.wait(timeout=120).state == "succeeded"
        keeper.download(tmp_path / "dl", progress=False)
        assert terminal.getvalue() == ""  # refused: nothing, even in a terminal
        seen: list[tuple[int, int | None]] = []
        keeper.download(tmp_path / "dl2", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (2 * MIB, 2 * MIB) and terminal.getvalue() == ""  # one's own callback


def test_the_cli_draws_its_bars_on_stderr_when_it_is_a_terminal(
    laptop: LocalCluster,
    work: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    assert cli.main(["submit", "--workdir", str(work), "--", *READ_DATA],
                    connection=laptop.connection()) == 0  # fmt: skip
    job_id = capsys.readouterr().out.strip()  # stdout stays the id alone, for scripts
    assert "3.00M/3.00M" in last(err, f"uploading {work}: 100%")
    with laptop.connection() as conn:
        keeper = gl.submit(KEEP_NOISE, connection=conn, progress=False)
        assert keeper.wait(timeout=120).state == "succeeded"
        assert conn.wait(job_id, timeout=120).state == "succeeded"
    dest = tmp_path / "cli-dl"
    assert cli.main(["artifacts", keeper.id, "--download", str(dest)],
                    connection=laptop.connection()) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == str((dest / "noise.bin").resolve())
    assert "2.00M/2.00M" in last(err, f"downloading job {keeper.id}'s artifacts: 100%")

    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    assert cli.main(["artifacts", keeper.id, "--download", str(dest), "--no-progress"],
                    connection=laptop.connection()) == 0  # fmt: skip
    assert quiet.getvalue() == ""
    piped = io.StringIO()
    monkeypatch.setattr("sys.stderr", piped)
    assert cli.main(["artifacts", keeper.id, "--download", str(dest)],
                    connection=laptop.connection()) == 0  # fmt: skip
    assert piped.getvalue() == ""  # stderr is no terminal: no bar unless --progress
    assert cli.main(["artifacts", keeper.id, "--download", str(dest), "--progress"],
                    connection=laptop.connection()) == 0  # fmt: skip
    assert "100%" in last(piped, f"downloading job {keeper.id}'s artifacts")


def test_map_progress_says_why_calls_wait_and_stops_once_they_run(
    laptop: LocalCluster, gl_shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    gate = gl_shared_dir / "gate"

    def held(x: int) -> int:
        while not os.path.exists(gate):
            time.sleep(0.05)
        return x * x

    with laptop.connection() as conn:
        fn = gl.remote(held, connection=conn)
        got: list[int] = []
        run = threading.Thread(
            target=lambda: got.extend(fn.map(range(3), chunk_size=1, progress=True))
        )
        run.start()
        try:
            # one slot: the first call runs (held), the others wait, and the bar says why
            until(lambda: any("queued: local-1: " in s for s in shown(out)), 90, "the reason")
        finally:
            gate.touch()
            run.join(timeout=120)
    assert got == [0, 1, 4]
    reason = next(s for s in shown(out) if "queued: local-1: " in s)
    assert reason.startswith(f"{held.__qualname__}: ") and "task slot is busy" in reason
    assert "queued" not in last(out, f"{held.__qualname__}: 100%")  # no stale reason


def test_map_progress_says_at_once_when_calls_can_never_run(
    laptop: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    with laptop.connection() as conn:
        fn = gl.remote(lambda x: x, connection=conn, gpus=1, queue_timeout="6s")
        with pytest.raises(errors.JobFailed, match="timed_out"):
            list(fn.map([1, 2], progress=True))
    said = [s for s in shown(out) if "cannot start: unsatisfiable" in s]
    assert said, shown(out)
    assert "local-1: needs 1 × GPU, has no GPUs" in said[0]
    assert "gpulayer up --simulated-gpus" in said[0]  # and what to do about it
