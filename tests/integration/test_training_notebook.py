"""notebooks/examples/ddp_train.ipynb, executed by nbclient against a real cluster."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "notebooks" / "examples"


def _text(cell) -> str:
    parts = []
    for o in cell.outputs:
        parts.append(o.get("text", ""))
        parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_the_training_notebook_trains_remotely_and_charts_its_metrics(cluster, monkeypatch):
    monkeypatch.setenv("GPULAYER_URL", cluster.url)
    monkeypatch.setenv("GPULAYER_TOKEN", cluster.admin_token)
    nb = nbformat.read(EXAMPLES / "ddp_train.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3", resources={
        "metadata": {"path": str(EXAMPLES)}})  # fmt: skip
    client.execute()  # raises on an error
    code = [c for c in nb.cells if c.cell_type == "code"]
    chart, ranks = _text(code[2]), _text(code[3])
    assert "succeeded" in chart
    assert "train/loss" in chart and "step" in chart
    checksums = {line.split(": ", 1)[1] for line in ranks.strip().splitlines()}
    assert len(ranks.strip().splitlines()) == 2 and len(checksums) == 1, ranks
    magic = _text(code[5])  # %%gpulayer --nproc-per-node 2: the cell on both ranks
    assert "[0] rank 0 of 2: all_reduce says 2" in magic, magic
    assert "[1] rank 1 of 2: all_reduce says 2" in magic, magic
