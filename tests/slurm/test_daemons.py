"""The Slurm fixture itself: what a killed run leaves is cleaned at the next start."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ..support import until
from .daemons import STATE_DIR, clean_stale

ROOT = Path(__file__).parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_daemons_left_by_a_killed_run_are_stopped_at_the_next_start(tmp_path):
    out = tmp_path / "up.log"
    with out.open("wb") as f:
        argv = [sys.executable, "-m", "tests.slurm.daemons", "up"]
        run = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        until(lambda: "SLURM_CONF=" in out.read_text() or run.poll() is not None, 60, "up")
        [record] = [json.loads(p.read_text()) for p in STATE_DIR.glob("*.json")
                    if json.loads(p.read_text())["pid"] == run.pid]  # fmt: skip
        daemons = list(record["daemons"].values())
        assert len(daemons) == 3 and all(alive(p) for p in daemons)
    finally:
        # the run dies; its daemons, each in its own session, do not
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert all(alive(p) for p in daemons)
    assert record["tag"] in clean_stale()
    until(lambda: not any(alive(p) for p in daemons), 30, "the daemons to be stopped")
    assert not Path(record["root"]).exists()
    assert record["tag"] not in clean_stale()
