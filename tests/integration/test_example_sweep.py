"""notebooks/examples/sweep.py as a user runs it: a script against a live cluster."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "notebooks" / "examples"


def test_the_sweep_script_trains_once_per_learning_rate_remotely(cluster, conn, tmp_path):
    env = {**os.environ, "GPULAYER_URL": cluster.url, "GPULAYER_TOKEN": cluster.admin_token,
           "GPULAYER_CONFIG": str(tmp_path / "absent.json")}  # fmt: skip
    before = {j.id for j in conn.jobs(limit=500)}
    proc = subprocess.run([sys.executable, "sweep.py", "--tiny"], cwd=EXAMPLES, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:] if line[:1] == " "]
    assert sorted(float(r[0]) for r in rows) == [0.003, 0.01, 0.03, 0.1, 0.3]
    losses = [float(r[1]) for r in rows]
    assert losses == sorted(losses)  # best first
    assert f"best lr {rows[0][0]}" in proc.stdout
    # A larger learning rate gets further in one epoch of SGD on this problem.
    by_lr = {float(r[0]): float(r[1]) for r in rows}
    assert by_lr[0.1] < by_lr[0.003]
    ran = [j for j in conn.jobs(limit=500) if j.id not in before]
    assert ran and all(j.spec.kind == "function" and j.state == "succeeded" for j in ran)
