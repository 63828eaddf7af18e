"""The control plane's layers, read from the source: handlers (``api/``) → services →
store, nothing upward; SQL and ``sqlite3`` only in the store; no import cycles."""

import ast
from pathlib import Path

import jupyter_ext

ROOT = Path(jupyter_ext.__file__).parent
WEB = ("tornado", "jupyter_server", "jupyter_core", "traitlets")
SQL = ("SELECT ", "UPDATE ", "INSERT ", "DELETE FROM")


def modules() -> dict[str, Path]:
    """Every module of ``jupyter_ext`` but the compatibility shims at old paths."""
    out = {}
    for path in ROOT.rglob("*.py"):
        if path.read_text().startswith('"""Compatibility shim'):
            continue
        parts = ["jupyter_ext", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Absolute names of what the module imports (``from . import x`` counts as
    importing ``pkg.x`` when that is a module)."""
    known = modules()
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return out


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_store_imports_nothing_of_the_control_plane_above_it():
    for name, path in modules().items():
        if within(name, "jupyter_ext.store"):
            above = {i for i in imports(name, path) if within(i, "jupyter_ext")}
            assert all(within(i, "jupyter_ext.store") for i in above), (name, above)


def test_only_the_app_and_handlers_import_the_web_layer():
    for name, path in modules().items():
        if within(name, "jupyter_ext.api") or name in ("jupyter_ext", "jupyter_ext.app"):
            continue
        found = imports(name, path)
        assert not any(within(i, "jupyter_ext.api") for i in found), name
        assert not any(within(i, w) for i in found for w in WEB), name


def test_handlers_reach_the_store_only_through_services():
    for name, path in modules().items():
        if within(name, "jupyter_ext.api"):
            assert not any(within(i, "jupyter_ext.store") for i in imports(name, path)), name


def test_sql_and_sqlite_live_only_in_the_store():
    for name, path in modules().items():
        if within(name, "jupyter_ext.store"):
            continue
        found = imports(name, path)
        assert not {"sqlite3", "aiosqlite"} & found, name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.lstrip().startswith(SQL), (name, node.value[:40])


def test_no_import_cycle_between_control_plane_modules():
    known = modules()
    graph = {n: {i for i in imports(n, p) if i in known and i != n} for n, p in known.items()}
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for n in sorted(graph):
        visit(n, [])
