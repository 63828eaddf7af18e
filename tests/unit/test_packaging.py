"""The distribution's metadata: one version, the license, what JupyterLab and PyPI read."""

import ast
import json
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def source_version() -> str:
    """``__version__`` as written in the file hatch reads it from (not imported)."""
    path = ROOT / PYPROJECT["tool"]["hatch"]["version"]["path"]
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError(f"no __version__ in {path}")


def test_the_version_is_written_once_and_everything_follows_it() -> None:
    import gpulayer

    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    version = source_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert gpulayer.__version__ == version
    package = json.loads((ROOT / "labextension" / "package.json").read_text(encoding="utf-8"))
    assert package["version"] == version, "labextension/package.json must follow __version__"


def test_the_installed_metadata_matches_the_source_version() -> None:
    try:
        installed = metadata.version("gpulayer")
    except metadata.PackageNotFoundError:
        pytest.skip("gpulayer is not installed")
    assert installed == source_version(), "reinstall (pip install -e .) after a version bump"


def test_the_license_file_is_the_one_the_metadata_names() -> None:
    assert PROJECT["license"] == "BSD-3-Clause"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License")
    assert "gpulayer contributors" in text
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]  # PEP 639


def test_jupyterlab_finds_the_prebuilt_extension_and_pypi_the_project() -> None:
    classifiers = set(PROJECT["classifiers"])
    assert "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in classifiers
    minimum = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert minimum is not None
    assert f"Programming Language :: Python :: 3.{minimum.group(1)}" in classifiers
    assert any(c.startswith("Operating System ::") for c in classifiers)
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(PROJECT["urls"])


def test_no_public_extra_caps_torch() -> None:
    # CI installs torch==2.13.0 first; a cap would only block users' newer torch.
    extras = PROJECT["optional-dependencies"]
    for name, requirements in extras.items():
        for req in requirements:
            if re.match(r"torch\b", req):
                assert "<" not in req and "==" not in req, f"extra {name!r}: {req}"


def test_the_dev_extra_brings_tests_docs_and_lint() -> None:
    extras = PROJECT["optional-dependencies"]
    assert extras["dev"] == ["gpulayer[test,docs]"]
    names = {re.split(r"[<>=\[ ]", r)[0] for r in extras["test"] + extras["docs"]}
    assert {"pytest", "ruff", "mypy", "mkdocs", "mkdocs-material"} <= names
