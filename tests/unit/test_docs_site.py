"""The documentation site: every page and decision is reachable, and a broken link fails.

The whole site is built by ``.ci/run`` (``mkdocs build --strict``); here the nav and the
index are checked against the files, and small sites built with the project's hook
show that a link to nothing fails the build, inside ``docs/`` or out of it.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "repository_files.py"


def nav_paths(entries: list[object]) -> set[str]:
    """Every page path named in an ``mkdocs.yml`` nav (nested sections included)."""
    found: set[str] = set()
    for entry in entries:
        if isinstance(entry, str):
            found.add(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                found |= nav_paths(value) if isinstance(value, list) else {value}
    return found


def mkdocs_config() -> dict[str, object]:
    # mkdocs.yml uses no custom YAML tags, so the safe loader reads it.
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert isinstance(config, dict)
    return config


def pages() -> list[str]:
    """The hand-written pages: docs/*.md and below, but neither ADRs nor the hook."""
    return sorted(
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if p.relative_to(DOCS).parts[0] not in ("adr", "hooks")
    )


def adrs() -> list[str]:
    return sorted(p.name for p in (DOCS / "adr").glob("[0-9]*.md"))


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = nav_paths(mkdocs_config()["nav"])  # type: ignore[arg-type]
    missing = [page for page in pages() if page not in nav]
    assert not missing, f"add these pages to the nav in mkdocs.yml: {missing}"
    for path in nav:
        if path.startswith("examples/"):  # the repository's notebooks/, mirrored by the hook
            assert (ROOT / "notebooks" / path.removeprefix("examples/")).is_file(), path
        else:
            assert (DOCS / path).is_file(), f"mkdocs.yml names {path}, which is not in docs/"


def test_the_index_links_every_page_and_every_decision() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    targets = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", index)}
    unlinked = [p for p in pages() if p != "index.md" and p not in targets]
    assert not unlinked, f"docs/index.md links none of {unlinked}"
    unlisted = [name for name in adrs() if f"adr/{name}" not in targets]
    assert not unlisted, f"docs/index.md lists none of these decisions: {unlisted}"


def test_the_hook_lists_every_decision_in_the_nav() -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]')")
    sys.path.insert(0, str(HOOK.parent))
    try:
        import repository_files
    finally:
        sys.path.remove(str(HOOK.parent))

    class Config:
        docs_dir = str(DOCS)
        nav: list[object] = [{"Home": "index.md"}, {"Decisions": []}]

    repository_files.on_config(Config())  # type: ignore[arg-type]
    listed = nav_paths(Config.nav)
    assert {f"adr/{name}" for name in adrs()} | {"adr/index.md"} <= listed


def build(tmp_path: Path, page: str) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of a one-page site that uses the project's hook."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page, encoding="utf-8")
    (tmp_path / "README.md").write_text("# outside docs/\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\nrepo_url: https://example.org/r\nstrict: true\n"
        f"hooks: ['{HOOK}']\nvalidation: {{unrecognized_links: warn, anchors: warn}}\n",
        encoding="utf-8",
    )
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("link", "named"),
    [
        ("missing.md", "missing.md"),  # inside docs/: MkDocs itself
        ("../no-such-file.md", "no-such-file.md"),  # out of docs/: the hook
        ("index.md#no-such-heading", "no-such-heading"),
    ],
)
def test_a_broken_link_fails_the_strict_build(tmp_path: Path, link: str, named: str) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]')")
    result = build(tmp_path, f"# Home\n\nSee [this]({link}).\n")
    assert result.returncode != 0
    assert named in result.stderr


def test_a_link_out_of_docs_goes_to_the_repository(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]')")
    result = build(tmp_path, "# Home\n\nSee [the README](../README.md).\n")
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="https://example.org/r/blob/main/README.md"' in html
