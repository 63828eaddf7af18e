"""The training examples in notebooks/examples/ run (``--tiny``) in a fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["linear_regression", "cnn_synthetic", "char_transformer", "custom_loop"]

# One interpreter runs every example in turn (torch imports once), each as __main__
# with its own argv, warnings as errors; a failure prints its traceback and exits 1.
RUNNER = """
import runpy, sys, warnings
warnings.simplefilter("error")
for path in sys.argv[1:]:
    sys.argv = [path, "--tiny"]
    print("=== " + path, flush=True)
    runpy.run_path(path, run_name="__main__")
"""


def test_every_example_runs_with_tiny(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env["GPULAYER_METRICS_FILE"] = str(tmp_path / "metrics.jsonl")
    paths = [str(ROOT / "notebooks" / "examples" / f"{name}.py") for name in EXAMPLES]
    proc = subprocess.run([sys.executable, "-c", RUNNER, *paths], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=110, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if line.startswith("===")] == [
        f"=== {p}" for p in paths
    ]
    assert "learned y =" in proc.stdout and "test accuracy" in proc.stdout
    assert "(world of 1)" in proc.stdout
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()  # ModelCheckpoint, default root
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") > 3
