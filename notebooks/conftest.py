"""Run the example notebooks (``pytest --nbval-lax notebooks/``) against a live cluster.

nbval starts a notebook's kernel when the notebook's first cell is set up, before
any fixture runs, so the cluster starts in a ``pytest_runtest_setup`` hook that runs
first: a control plane and one local worker (two simulated GPUs) under a temporary
directory, with ``GPULAYER_URL`` and ``GPULAYER_TOKEN`` exported for the kernels
(``%load_ext gpulayer`` and ``gl.connect()`` find them there), and
``GPULAYER_EXAMPLES_TINY=1`` so that the training examples run on tiny settings.
It stops when the session ends.

With ``GPULAYER_NOTEBOOK_OUTPUTS=DIR`` each notebook is also written below ``DIR``
(``DIR/notebooks/quickstart.ipynb``) with the outputs this run produced, which the
documentation site shows (``docs/hooks/repository_files.py``): the site's outputs
are real and cost no second run.
"""

import copy
import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_cluster = None
_tmp: tempfile.TemporaryDirectory | None = None
OUTPUTS_ENV = "GPULAYER_NOTEBOOK_OUTPUTS"
#: Per notebook file: its nbformat node (as nbval read it), cell index -> outputs.
_ran: dict[Path, tuple[Any, dict[int, tuple[list[Any], int]]]] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start the cluster before the first notebook's kernel starts."""
    global _cluster, _tmp
    if _cluster is not None:
        return
    from gpulayer.cli.cluster import LocalCluster

    _tmp = tempfile.TemporaryDirectory(prefix="gpulayer-notebooks-")
    _cluster = LocalCluster(Path(_tmp.name), workers=1, slots=4, simulated_gpus="2xA100-80GB",
                            heartbeat_seconds=0.5, lease_seconds=5.0).start()  # fmt: skip
    os.environ.update(
        GPULAYER_URL=_cluster.url,
        GPULAYER_TOKEN=_cluster.admin_token,
        GPULAYER_CONFIG=str(Path(_tmp.name) / "no-saved-connection.json"),
        GPULAYER_EXAMPLES_TINY="1",  # the training examples take a few steps, not minutes
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Keep the outputs nbval read from the kernel for this cell (when asked to)."""
    yield
    outputs = getattr(item, "test_outputs", None)
    notebook = getattr(item.parent, "nb", None)
    if not os.environ.get(OUTPUTS_ENV) or outputs is None or notebook is None:
        return
    cells = _ran.setdefault(Path(str(item.parent.path)), (notebook, {}))[1]
    cells[id(item.cell)] = (copy.deepcopy(outputs), len(cells) + 1)


def _write_outputs(root: Path) -> None:
    """Each notebook that ran, with its outputs, below ``root`` at its repository path."""
    import nbformat

    here = Path(__file__).resolve().parent
    for path, (notebook, cells) in _ran.items():
        result = copy.deepcopy(notebook)
        for cell, original in zip(result.cells, notebook.cells, strict=True):
            if cell.cell_type == "code" and id(original) in cells:
                cell.outputs, cell.execution_count = cells[id(original)]
                for output in cell.outputs:
                    if output.output_type == "execute_result":
                        output.execution_count = cell.execution_count
        target = root / "notebooks" / path.resolve().relative_to(here)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(result, str(target))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the notebooks' outputs (when asked to), stop the cluster (by PID) and
    remove its directory."""
    global _cluster, _tmp
    if os.environ.get(OUTPUTS_ENV) and _ran:
        _write_outputs(Path(os.environ[OUTPUTS_ENV]))
    if _cluster is not None:
        _cluster.stop()
        _cluster = None
    if _tmp is not None:
        _tmp.cleanup()
        _tmp = None
