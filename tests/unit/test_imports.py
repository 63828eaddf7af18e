"""Dependency direction (STYLE.md §1), each rule checked in a fresh interpreter.

A module that does not import is a failure here, never a skip: a broken import would
otherwise silence the very rules these tests check.
"""

import pytest

from ..support import fresh_interpreter

HEAVY = ["torch", "IPython", "ipywidgets", "pynvml", "tornado", "jupyter_server", "jupyter_ext"]

PROBE = """
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps({{"loaded": sorted(sys.modules), "files": {{
    name: getattr(sys.modules[name], "__file__", None) for name in {modules!r}}}}}))
"""


def imported_by(*modules: str) -> tuple[set[str], dict[str, str | None]]:
    """Modules in ``sys.modules`` after importing ``modules`` in a fresh interpreter."""
    result, _ = fresh_interpreter(PROBE.format(modules=list(modules)))
    return set(result["loaded"]), result["files"]


def tops(loaded: set[str]) -> set[str]:
    return {name.split(".")[0] for name in loaded}


@pytest.mark.parametrize(
    "module",
    ["gpulayer", "gpulayer.client", "gpulayer.cli", "gpulayer.functions", "gpulayer.notebook"],
)
def test_kernel_side_imports_stay_light(module: str) -> None:
    loaded, _ = imported_by(module)
    assert tops(loaded).isdisjoint(HEAVY), sorted(tops(loaded) & set(HEAVY))


def test_import_gpulayer_does_not_load_the_http_client() -> None:
    loaded, _ = imported_by("gpulayer")
    assert "httpx" not in loaded
    assert "gpulayer.client" not in loaded


def test_gpulayer_never_imports_jupyter_ext() -> None:
    loaded, _ = imported_by("gpulayer.cli", "gpulayer.client")
    assert "jupyter_ext" not in tops(loaded)
    loaded, _ = imported_by("gpulayer.worker.agent")
    assert tops(loaded).isdisjoint({"jupyter_ext", "IPython", "ipywidgets", "tornado"})


def test_jupyter_ext_imports_neither_client_nor_worker() -> None:
    loaded, files = imported_by("jupyter_ext")
    assert files["jupyter_ext"] is not None, "jupyter_ext is a package with an __init__"
    assert not {"gpulayer.client", "gpulayer.worker", "gpulayer.cli"} & loaded
    assert not any(name.startswith("gpulayer.worker") for name in loaded)


def test_a_rank_of_a_distributed_function_starts_without_the_agent() -> None:
    loaded, _ = imported_by("gpulayer.worker.rank_call")
    assert "gpulayer.worker.agent" not in loaded
    assert tops(loaded).isdisjoint({"httpx", "psutil", "IPython", "torch"})


def test_a_broken_import_fails_instead_of_skipping() -> None:
    with pytest.raises(AssertionError, match="ModuleNotFoundError"):
        imported_by("gpulayer.no_such_module")


def test_the_helpers_a_remote_kernel_calls_load_no_http_client() -> None:
    loaded, _ = imported_by("gpulayer.variables")
    assert tops(loaded).isdisjoint({"httpx", "IPython", "torch"})
    assert "gpulayer.client" not in loaded


def test_a_worker_loads_zmq_only_when_it_relays_a_kernel() -> None:
    loaded, _ = imported_by("gpulayer.worker.agent")
    assert "zmq" not in loaded, "ZMQ costs every worker's start ~20 ms (ADR 0141)"
    loaded, _ = imported_by("gpulayer.worker.relayed_kernels")
    assert "zmq" in loaded


def test_the_command_line_goes_without_httpx_own_command_line() -> None:
    probe = (
        "import json, sys\n"
        "sys.argv = ['gpulayer', '--version']\n"
        "from gpulayer.__main__ import main\n"
        "code = main()\n"
        "print(json.dumps({'code': code, 'httpx': 'httpx' in sys.modules,"
        " 'cli': sys.modules.get('httpx._main', 'absent'), 'click': 'click' in sys.modules,"
        " 'main': callable(sys.modules['httpx'].main)}))\n"
    )
    result, lines = fresh_interpreter(probe)
    assert lines[0].startswith("gpulayer ")
    assert result == {"code": 0, "httpx": True, "cli": None, "click": False, "main": True}
