"""MkDocs hook (``mkdocs.yml``): what the site takes from outside ``docs/``.

1. **The example notebooks.** ``notebooks/README.md`` and every ``notebooks/**.ipynb``
   become pages under ``examples/`` (``examples/quickstart.ipynb``; ``notebooks/`` is
   the address of ``docs/notebooks.md``), which mkdocs-jupyter renders. Each notebook
   comes from ``$GPULAYER_NOTEBOOK_OUTPUTS`` when that folder has it: the notebook with
   the outputs of CI's nbval run against a live cluster (``notebooks/conftest.py``
   writes them there). Otherwise it is the notebook as committed (outputs cleared but
   the checked ones), and with ``GPULAYER_DOCS_REQUIRE_OUTPUTS=1`` (set by ``.ci/run``)
   that is an error.
2. **Links that leave ``docs/``.** The pages are read on GitHub too, where
   ``../notebooks/`` or ``../benchmarks/results/trainer.md`` are right. Such a link is
   rewritten to the page when the site has it (a folder to its ``README.md``, or the
   nearest one above it), else to the file in the repository (``repo_url``). A target
   that does not exist is a warning, which ``mkdocs build --strict`` turns into a
   failure, as it does for links inside ``docs/``.
3. **The ADRs.** The ``Decisions`` section of the nav lists every ``docs/adr/*.md`` in
   number order after a generated ``adr/index.md`` (where links to ``adr/`` lead), so a
   new decision needs no edit here; ``docs/index.md`` still lists it by hand
   (``tests/unit/test_docs_site.py`` checks that).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.repository_files")

#: Folders of the repository whose files become pages, and where they go in the site
#: (not ``notebooks/``: that is docs/notebooks.md's address).
MIRRORED = {"notebooks": "examples"}
OUTPUTS_ENV = "GPULAYER_NOTEBOOK_OUTPUTS"
REQUIRE_ENV = "GPULAYER_DOCS_REQUIRE_OUTPUTS"
#: ``](target)`` of an inline Markdown link or image; code spans are left alone below.
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^(```|~~~)")
ADR_INDEX = """# Decisions

Why gpulayer is built the way it is, one decision a page (architecture decision
records), in the order they were taken.

"""


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Fill the nav's ``Decisions`` section: the generated index, then every ADR."""
    entries: list[dict[str, str]] = [{"All decisions": "adr/index.md"}]
    entries += [{title: f"adr/{name}"} for name, title in _adrs(config)]
    for entry in config.nav or []:
        if isinstance(entry, dict) and "Decisions" in entry:
            entry["Decisions"] = entries
    return config


def _root(config: MkDocsConfig) -> Path:
    """The repository: the folder of ``mkdocs.yml``."""
    return Path(config.config_file_path).resolve().parent


def _adrs(config: MkDocsConfig) -> list[tuple[str, str]]:
    """``(file name, title)`` of each ADR in number order; the title is its heading."""
    found = []
    for path in sorted((Path(config.docs_dir) / "adr").glob("[0-9]*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        heading = next((line[2:].strip() for line in lines if line.startswith("# ")), path.stem)
        found.append((path.name, heading))
    return found


@event_priority(100)  # before mkdocs-jupyter, which turns the .ipynb files into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the mirrored folders' notebooks and READMEs, and the ADR index."""
    listing = "".join(f"- [{title}]({name})\n" for name, title in _adrs(config))
    files.append(File.generated(config, "adr/index.md", content=ADR_INDEX + listing))
    outputs = os.environ.get(OUTPUTS_ENV)
    root = _root(config)
    missing = []
    for folder, site_folder in MIRRORED.items():
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            uri = site_folder + rel.removeprefix(folder)
            if ".ipynb_checkpoints" in rel or path.suffix not in (".ipynb", ".md"):
                continue
            source = path
            if path.suffix == ".ipynb":
                if outputs and (Path(outputs) / rel).is_file():
                    source = Path(outputs) / rel
                else:
                    missing.append(rel)
            files.append(_file(uri, source, config))
    if missing:
        where = f"{OUTPUTS_ENV}={outputs}" if outputs else f"{OUTPUTS_ENV} unset"
        message = f"notebooks without executed outputs ({where}): {', '.join(missing)}"
        if os.environ.get(REQUIRE_ENV) == "1":
            log.warning(message)  # --strict: the build fails
        else:
            log.info("%s; shown as committed", message)
    return files


def _file(uri: str, source: Path, config: MkDocsConfig) -> File:
    """A page at ``uri`` with the content of ``source``, copied into a staging folder
    beside the site (mkdocs-jupyter's NotebookFile cannot wrap a ``File.generated``,
    whose content lives elsewhere than ``src_dir/uri``)."""
    staging = Path(config.site_dir).parent / "docs-sources"
    copy = staging / uri
    data = source.read_bytes()
    if not copy.is_file() or copy.read_bytes() != data:  # unchanged: `mkdocs serve` rests
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(data)
    return File(uri, str(staging), config.site_dir, config.use_directory_urls)


def site_path(repo_path: str) -> str | None:
    """Where a mirrored repository file is in the site, else None."""
    for folder, site_folder in MIRRORED.items():
        if repo_path == folder or repo_path.startswith(folder + "/"):
            return site_folder + repo_path.removeprefix(folder)
    return None


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite links that leave ``docs/`` (see the module docstring)."""
    src = page.file.src_uri
    if not page.file.abs_src_path or not _inside(Path(page.file.abs_src_path), config.docs_dir):
        return markdown  # a mirrored page: its links stay inside its own folder
    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        if not fenced:
            line = LINK.sub(lambda m: m[1] + _rewrite(m[2], src, config, files) + m[3], line)
        out.append(line)
    return "".join(out)


def _inside(path: Path, folder: str) -> bool:
    return path.resolve().is_relative_to(Path(folder).resolve())


def _rewrite(target: str, src: str, config: MkDocsConfig, files: Files) -> str:
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
        return target  # a URL, an anchor in the page, an absolute path
    path, _, anchor = target.partition("#")
    root = _root(config)
    docs = Path(config.docs_dir).resolve().relative_to(root).as_posix()
    repo_path = posixpath.normpath(posixpath.join(docs, posixpath.dirname(src), path))
    if repo_path == docs or repo_path.startswith(docs + "/"):
        index = posixpath.join(repo_path.removeprefix(docs).lstrip("/"), "index.md")
        if (root / repo_path).is_dir() and files.get_file_from_path(index) is not None:
            rel = posixpath.relpath(index, posixpath.dirname(src) or ".")
            return rel + (f"#{anchor}" if anchor else "")  # a folder: its index page
        return target  # inside docs/: MkDocs checks it
    if repo_path.startswith("..") or not (root / repo_path).exists():
        log.warning("%s: the link %r points to %s, which does not exist", src, target, repo_path)
        return target
    page = site_path(repo_path)
    folder = repo_path
    while (root / folder).is_dir() and folder not in ("", "."):  # a folder: its README, or
        page = site_path(posixpath.join(folder, "README.md"))  # the nearest one above it
        if page is not None and files.get_file_from_path(page) is not None:
            break
        folder = posixpath.dirname(folder)
    if page is not None and files.get_file_from_path(page) is not None:
        rel = posixpath.relpath(page, posixpath.dirname(src) or ".")
        return rel + (f"#{anchor}" if anchor else "")
    kind = "tree" if (root / repo_path).is_dir() else "blob"
    base = (config.repo_url or "").rstrip("/")
    return f"{base}/{kind}/main/{repo_path}" + (f"#{anchor}" if anchor else "")
