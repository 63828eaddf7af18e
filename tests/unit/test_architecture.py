"""The shape of the code, checked statically (``ast``, nothing is imported):

* no import cycle between modules of ``gpulayer`` and ``jupyter_ext``;
* the control plane's layers: handlers -> services -> store, nothing upward, and no
  service or store module touches the web framework;
* handlers never import the store, and SQL and the database driver live only in it;
* no module uses another module's private (``_x``) names.

What counts as an import: every ``import``/``from ... import`` statement, each of one
kind: ``module`` (runs on import), ``function`` (inside a function: runs on call) or
``type`` (under ``if TYPE_CHECKING:``). The cycle check counts the kinds in
:data:`CYCLE_KINDS`, all three today: a function-level import that closes a loop is
still two modules that need each other (it only hides the loop from the interpreter),
and a type-only one is still a dependency of the design (the old ``scheduler`` <->
``sessions`` was such a loop). The layer and private-name checks count every import.
Dynamic imports (``importlib.import_module``) are not seen. ``from pkg import name``
depends on ``pkg.name`` when that is a module, else on ``pkg``.

Each check has a ``KNOWN_*`` set with exactly the violations the code had when the
check was written: the test fails on any violation not listed, and on a listed one
that is gone (so the list only ever shrinks). :data:`DISPLAY_HOOKS` names the only
imports allowed to point from the client up to the notebook package, with why.
"""

import ast
import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpulayer", "jupyter_ext")

#: The control plane's layers, lowest first, as ``fnmatch`` patterns on module names.
#: A module belongs to the first layer with a matching pattern; a module in no layer
#: is a composition root (it wires everything up and may import anything) if it is
#: listed in ``ROOTS``, else it is a service. A module may import its own layer and
#: the layers below it, never one above.
LAYERS: dict[str, tuple[str, ...]] = {
    "store": ("jupyter_ext.store", "jupyter_ext.store.*"),
    "services": ("jupyter_ext.*",),
    "handlers": ("jupyter_ext.api", "jupyter_ext.api.*", "jupyter_ext.*handlers"),
}
#: Checked in this order (the most specific patterns first).
MATCH_ORDER = ("handlers", "store", "services")
ROOTS = (
    "jupyter_ext",
    "jupyter_ext.app",
    "jupyter_ext.service",
    "jupyter_ext.headless",
    "jupyter_ext.__main__",
)
#: Modules only handlers (and roots) may import: the web framework and its config.
WEB_MODULES = ("tornado", "jupyter_server", "jupyter_core", "traitlets")
#: Only the store may hold SQL or open the database.
SQL_PREFIXES = ("SELECT ", "UPDATE ", "INSERT ", "DELETE FROM")
DB_MODULES = ("sqlite3", "aiosqlite")

#: The only modules that may import IPython or ipywidgets: the notebook package, and the
#: Trainer's progress bar, which draws a widget when it runs in a notebook (both lazily).
NOTEBOOK_MODULES = ("gpulayer.notebook", "gpulayer.notebook.*", "gpulayer.pytorch.progress")

#: The import kinds (see the module docstring) the cycle check follows.
CYCLE_KINDS = frozenset({"module", "function", "type"})

#: Import cycles kept on purpose, each as its modules (a strongly connected component), sorted.
KNOWN_CYCLES: set[tuple[str, ...]] = {
    # Type-only, as in Lightning: the Trainer hands itself to its callbacks, progress bar
    # and Module, whose hook signatures name it under TYPE_CHECKING. At run time nothing
    # in gpulayer.pytorch imports the trainer but its own package.
    (
        "gpulayer.pytorch.callbacks",
        "gpulayer.pytorch.module",
        "gpulayer.pytorch.progress",
        "gpulayer.pytorch.trainer",
    ),
}
#: Imports that point from the client up to the notebook package on purpose, each with
#: why. They must stay inside a function (they run when a display asks, never on import),
#: and the cycle check leaves them out.
DISPLAY_HOOKS: dict[tuple[str, str], str] = {
    ("gpulayer.client.jobs", "gpulayer.notebook.render"): (
        "Job._repr_mimebundle_: Jupyter asks the object itself for its rich display; "
        "drawing it needs ipywidgets, which only gpulayer.notebook may import"
    ),
    ("gpulayer.client.connection", "gpulayer.notebook.render"): (
        "Connection._repr_mimebundle_: the workers table, as above"
    ),
}
#: Upward imports today, as "importer -> imported".
KNOWN_LAYER_VIOLATIONS: set[str] = set()
#: Private names used across modules today, as "user: module._name".
KNOWN_PRIVATE_USES: set[str] = set()


@dataclass(frozen=True)
class Import:
    """One dependency of ``source`` on ``target``, and the names it takes from it."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int
    kind: str  # "module", "function" or "type"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    """Every module of the project packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = project_modules()


def _package_of(module: str) -> str:
    is_package = MODULES[module].name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package_of(module).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _nearest_module(name: str) -> str | None:
    """The longest prefix of ``name`` that is a project module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(node: ast.AST, kind: str = "module") -> Iterator[tuple[ast.AST, str]]:
    """Every node under ``node`` with the import kind of where it stands."""
    for child in ast.iter_child_nodes(node):
        inner = kind
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = "function" if kind == "module" else kind
        yield child, inner
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, "type"
                yield from _statements(stmt, "type")
            for stmt in child.orelse:
                yield stmt, kind
                yield from _statements(stmt, kind)
        else:
            yield from _statements(child, inner)


def imports(module: str) -> Iterator[Import]:
    """Every import statement of ``module`` (at any depth), resolved to project modules
    and, for ``import`` statements of outside packages, their dotted name."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    for node, kind in _statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _nearest_module(alias.name) or alias.name
                yield Import(module, target, (), node.lineno, kind)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            names: dict[str, list[str]] = {}
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in MODULES else (_nearest_module(base) or base)
                names.setdefault(target, []).append("" if target == sub else alias.name)
            for target, taken in names.items():
                yield Import(module, target, tuple(n for n in taken if n), node.lineno, kind)


def project_imports() -> list[Import]:
    return [i for m in MODULES for i in imports(m) if i.target in MODULES and i.target != m]


# ---------------------------------------------------------------------- cycles


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_between_modules():
    edges: dict[str, set[str]] = {}
    for i in project_imports():
        if i.kind in CYCLE_KINDS and (i.source, i.target) not in DISPLAY_HOOKS:
            edges.setdefault(i.source, set()).add(i.target)
    found = cycles(edges)
    new = found - KNOWN_CYCLES
    assert not new, "import cycles (modules that import each other, at any depth): " + "; ".join(
        " <-> ".join(c) for c in sorted(new)
    )
    assert not KNOWN_CYCLES - found, f"fixed, remove from KNOWN_CYCLES: {KNOWN_CYCLES - found}"


def test_the_cycle_finder_sees_a_loop_through_three_modules():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}
    assert cycles({"a": {"b"}, "b": set()}) == set()


# ---------------------------------------------------------------------- layers


def layer_of(module: str) -> str | None:
    """The layer of a ``jupyter_ext`` module, None for roots and other packages."""
    if module in ROOTS or not module.startswith("jupyter_ext"):
        return None
    for layer in MATCH_ORDER:
        if any(fnmatch.fnmatchcase(module, p) for p in LAYERS[layer]):
            return layer
    return "services"


def layer_violations() -> set[str]:
    rank = {layer: n for n, layer in enumerate(LAYERS)}
    found = set()
    for m in MODULES:
        layer = layer_of(m)
        if layer is None:
            continue
        for i in imports(m):
            if i.target in ROOTS:
                found.add(f"{m} -> {i.target}")
            elif i.target in MODULES:
                target = layer_of(i.target)
                if target is not None and rank[target] > rank[layer]:
                    found.add(f"{m} -> {i.target}")
            elif layer != "handlers" and any(
                i.target == w or i.target.startswith(w + ".") for w in WEB_MODULES
            ):
                found.add(f"{m} -> {i.target}")
    return found


def test_control_plane_layers_only_import_downward():
    found = layer_violations()
    new = found - KNOWN_LAYER_VIOLATIONS
    assert not new, (
        f"upward imports (layers, lowest first: {', '.join(LAYERS)}; only handlers may "
        f"import {', '.join(WEB_MODULES)}; nothing imports {', '.join(ROOTS)}): "
        + "; ".join(sorted(new))
    )
    gone = KNOWN_LAYER_VIOLATIONS - found
    assert not gone, f"fixed, remove from KNOWN_LAYER_VIOLATIONS: {gone}"


def test_handlers_reach_the_store_only_through_services():
    for m in MODULES:
        if layer_of(m) == "handlers":
            found = {i.target for i in imports(m)}
            assert not {t for t in found if layer_of(t) == "store"}, m


def test_sql_and_the_database_driver_live_only_in_the_store():
    for m, path in MODULES.items():
        if layer_of(m) == "store":
            continue
        assert not {i.target for i in imports(m)} & set(DB_MODULES), m
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.lstrip().startswith(SQL_PREFIXES), (m, node.value[:40])


def test_every_layer_has_modules():
    layers = {layer_of(m) for m in MODULES}
    assert {"handlers", "services", "store"} <= layers, layers
    assert layer_of("jupyter_ext.api.jobs") == layer_of("jupyter_ext.api") == "handlers"
    assert layer_of("jupyter_ext.store.records") == layer_of("jupyter_ext.store") == "store"
    assert layer_of("jupyter_ext.jobs") == "services" and layer_of("jupyter_ext.app") is None


def test_only_the_notebook_package_imports_ipython():
    for m in MODULES:
        if any(fnmatch.fnmatchcase(m, p) for p in NOTEBOOK_MODULES):
            continue
        found = {i.target.split(".")[0] for i in imports(m)}
        assert not found & {"IPython", "ipywidgets"}, m


def test_display_hooks_stay_inside_functions():
    for (source, target), why in DISPLAY_HOOKS.items():
        kinds = {i.kind for i in imports(source) if i.target == target}
        assert kinds == {"function"}, (source, target, kinds, why)


def test_import_kinds_are_told_apart():
    kinds = {(i.target, i.kind) for i in imports("jupyter_ext.prometheus")}
    assert ("jupyter_ext.store", "type") in kinds
    kinds = {(i.target, i.kind) for i in imports("gpulayer.client.jobs")}
    assert ("gpulayer.notebook.render", "function") in kinds


# ------------------------------------------------------------- private names


def _private(name: str) -> bool:
    """``_x``, not ``__x__`` nor protocol names such as ``_repr_html_``."""
    return name.startswith("_") and not name.endswith("_")


def defined_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, methods, assigned names and
    attributes (``self._x = ...``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if _private(n)}


def private_uses() -> set[str]:
    """``user: module._name`` for each private name of one project module that another
    one imports (``from m import _x``), reaches through the module (``m._x``, ``m``
    bound to the module by an import) or reaches through a collaborator it holds
    (``self.other._x``, where ``_x`` is defined in ``module`` and not in the user)."""
    trees = {m: ast.parse(path.read_text(), str(path)) for m, path in MODULES.items()}
    defined = {m: defined_private_names(tree) for m, tree in trees.items()}
    found = set()
    for m, path in MODULES.items():
        bound: dict[str, str] = {}  # local name -> project module
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _nearest_module(alias.name)
                    if target is not None and alias.asname:
                        bound[alias.asname] = target
                    elif target is not None:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(m, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in MODULES:
                        bound[alias.asname or alias.name] = sub
                        own_package = _package_of(m) == base or m.startswith(sub + ".")
                        if _private(alias.name) and not own_package:
                            found.add(f"{m}: {sub}")
                    elif _private(alias.name) and _nearest_module(base) not in (None, m):
                        found.add(f"{m}: {base}.{alias.name}")
        for node in ast.walk(trees[m]):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in bound:
                owner = bound[base.id]
                target = f"{owner}.{node.attr}"
                if owner != m and target not in MODULES:
                    found.add(f"{m}: {target}")
            elif (
                isinstance(base, ast.Attribute)
                and isinstance(base.value, ast.Name)
                and base.value.id == "self"
                and node.attr not in defined[m]
            ):
                owners = sorted(o for o, names in defined.items() if node.attr in names)
                if owners:
                    found.add(f"{m}: {'|'.join(owners)}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = private_uses()
    new = found - KNOWN_PRIVATE_USES
    assert not new, "private names used from another module: " + "; ".join(sorted(new))
    gone = KNOWN_PRIVATE_USES - found
    assert not gone, f"fixed, remove from KNOWN_PRIVATE_USES: {gone}"
