"""@gl.remote from notebook cells, executed by nbclient in a real ipykernel."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

CELLS = [
    "import gpulayer as gl\nconn = gl.connect()",
    "factor = 3\nscale = gl.remote(lambda x: x * factor)\nprint(scale.run(14))",
    "def make_adder(n):\n    def add(x):\n        return x + n\n    return add\n"
    "add5 = gl.remote(make_adder(5))\nprint(add5.run(1))",
    "print(list(gl.remote(lambda x: -x).map([1, 2, 3], progress=False)))",
    "def talk():\n    print('said remotely')\n    return 'ok'\ngl.remote(talk).run()",
    "def boom():\n    raise KeyError('nope')\ngl.remote(boom).run()",
]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.fixture
def executed(cluster, monkeypatch):
    monkeypatch.setenv("GPULAYER_URL", cluster.url)
    monkeypatch.setenv("GPULAYER_TOKEN", cluster.admin_token)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in CELLS])
    NotebookClient(nb, timeout=90, kernel_name="python3", allow_errors=True).execute()
    return nb.cells


def test_lambdas_and_closures_from_cells_run_remotely(executed):
    assert _text(executed[1]).strip() == "42"  # a lambda reading a notebook global
    assert _text(executed[2]).strip() == "6"  # a closure
    assert _text(executed[3]).strip() == "[-1, -2, -3]"
    talk = executed[4]
    assert "said remotely" in _text(talk)  # the remote print lands in the cell
    assert any(o.output_type == "execute_result" and "'ok'" in o.data["text/plain"]
               for o in talk.outputs)  # fmt: skip


def test_remote_exception_shows_the_cell_line(executed):
    (error,) = [o for o in executed[5].outputs if o.output_type == "error"]
    assert error.ename == "KeyError"
    trace = "\n".join(error.traceback)
    assert "raise KeyError('nope')" in trace  # the remote frame, with the cell's source
    assert "on worker local-1" in trace


def test_the_remote_functions_notebook_runs(cluster, monkeypatch):
    monkeypatch.setenv("GPULAYER_URL", cluster.url)
    monkeypatch.setenv("GPULAYER_TOKEN", cluster.admin_token)
    nb = nbformat.read(NOTEBOOKS / "remote_functions.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()  # raises on an error
    results = {
        i: o.data["text/plain"]
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "execute_result"
    }
    assert "144" in results.values()
    assert "(101, 15)" in results.values()
    assert "caught: learning rate must be positive, got -1" in "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
