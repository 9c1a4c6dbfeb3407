"""The layer rule of ``miniray/_private/__init__.py``, held over every import in ``miniray/``.

Every ``import`` and ``from ... import`` is read with ``ast``: module-level ones and those inside
functions, absolute and relative. Each module maps to a layer; an import that points to a higher
layer fails with the file, the line and both layers. A ``_private`` module that no layer names
fails too, so a new module has to be placed. The import graph, function-level imports
included, must have no cycle at all: a lazy import cannot hide one. And an import inside a
function must say why it is there (a comment with "lazy": it keeps a heavy or rarely needed
module out of ``import miniray`` or out of a process), except imports of ``miniray.exceptions``,
a leaf that ``import miniray`` always loads.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap
from dataclasses import dataclass

import pytest

import miniray

# Layer ranks, lowest first. Layers of the same rank may import each other (the cycle check
# still applies); an import to a higher rank is an error.
RANKS = {
    "core": 0,
    "host": 1, "transport": 1,
    "object_store": 2, "ledger": 2,
    "owner": 3, "worker": 3,
    "top": 4,  # runtime, api, surface, and the public modules beside them
    "node": 5,
    "cli": 6,
}
SUBPACKAGES = {"core", "host", "transport", "object_store", "ledger", "owner", "worker", "node"}
TOP = {"runtime", "init_args", "driver_session", "api", "surface", "object_ref_generator",
       "state_api", "internal_api"}
# Public modules that sit lower than "top": leaves every layer may import.
PUBLIC_LEAVES = {"exceptions": "core", "_version": "core"}
PUBLIC_MAY_IMPORT = {"core", "top"}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (the deepest one that exists)
    path: str
    line: int
    in_function: bool = False
    marked_lazy: bool = False


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_imports(root: pathlib.Path) -> tuple[set[str], list[Import]]:
    """Every module under package directory ``root`` and every import between them."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    package = root.name
    imports = []
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, str(path))
        in_function = {id(inner) for outer in ast.walk(tree)
                       if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for inner in ast.walk(outer)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # "from pkg import mod" imports the module pkg.mod when there is one
                candidates = [f"{base}.{alias.name}" for alias in node.names] or [base]
                candidates = [c if c in files else base for c in candidates]
            else:
                continue
            for target in candidates:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target.split(".")[0] == package and target != name:
                    imports.append(Import(name, target, str(path), node.lineno,
                                          id(node) in in_function, _marked_lazy(lines, node)))
    return set(files), sorted(set(imports), key=lambda i: (i.path, i.line, i.target))


def _marked_lazy(lines: list[str], node: ast.stmt) -> bool:
    """A comment with "lazy" on the import's lines or on the comment and import lines directly
    above it (one comment may cover a group of imports)."""
    first = node.lineno - 1
    while first > 0 and lines[first - 1].strip().startswith(("#", "from ", "import ")):
        first -= 1
    block = lines[first:node.end_lineno]
    return any("lazy" in line.partition("#")[2].lower() for line in block)


def layer_of(module: str) -> str | None:
    """The layer of a module of the ``miniray`` package, or None when no layer names it."""
    parts = module.split(".")
    if parts[1:2] != ["_private"]:
        if parts[1:] == ["__main__"]:
            return "cli"
        return PUBLIC_LEAVES.get(parts[1], "top") if len(parts) > 1 else "top"
    if len(parts) == 2:
        return "core"  # the package docstring
    if parts[2] in SUBPACKAGES:
        return parts[2]
    if len(parts) == 3 and parts[2] in TOP:
        return "top"
    if parts[2:] == ["cli"]:
        return "cli"
    return None


def is_public(module: str) -> bool:
    return module.split(".")[1:2] != ["_private"]


def unexplained_lazy_imports(imports: list[Import]) -> list[str]:
    return [f"{imp.path}:{imp.line}: {imp.source} imports {imp.target} inside a function "
            "with no comment saying why (lazy); import it at the top of the module"
            for imp in imports
            if imp.in_function and not imp.marked_lazy and imp.target != "miniray.exceptions"]


def layer_errors(modules: set[str], imports: list[Import]) -> list[str]:
    """One message per upward import, per public import below the allowed layers, and per
    unplaced module."""
    errors = [f"{m}: no layer names this module; place it in a subpackage of "
              f"miniray/_private (see its __init__.py)"
              for m in sorted(modules) if layer_of(m) is None]
    for imp in imports:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src is None or dst is None:
            continue
        where = f"{imp.path}:{imp.line}: {imp.source} ({src}) imports {imp.target} ({dst})"
        if RANKS[dst] > RANKS[src]:
            errors.append(f"{where}: a higher layer")
        elif (is_public(imp.source) and src == "top" and not is_public(imp.target)
              and dst not in PUBLIC_MAY_IMPORT):
            errors.append(f"{where}: public modules import only core and runtime/api/surface")
    return errors


def cycles(modules: set[str], imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


ROOT = pathlib.Path(miniray.__file__).parent


def test_no_import_points_to_a_higher_layer():
    errors = layer_errors(*collect_imports(ROOT))
    assert not errors, "\n".join(errors)


def test_no_import_cycle_even_through_function_level_imports():
    found = cycles(*collect_imports(ROOT))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_function_level_import_says_why():
    errors = unexplained_lazy_imports(collect_imports(ROOT)[1])
    assert not errors, "\n".join(errors)


def test_the_checker_sees_function_level_imports():
    modules, imports = collect_imports(ROOT)
    # the checks above mean something only if imports inside functions are seen at all
    assert any(imp.source == "miniray._private.runtime" and imp.in_function
               and imp.target == "miniray._private.owner.owner" for imp in imports)
    assert len(imports) > 150


# ---------------------------------------------------------------- the checker on a small tree
def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / "miniray"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for directory in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").touch()
    return root


def test_checker_fails_on_an_upward_import_inside_a_function(tmp_path):
    root = _tree(tmp_path, {
        "_private/core/ids.py": """
            def later():
                from miniray._private.owner import owner
                return owner
        """,
        "_private/owner/owner.py": "from miniray._private.core import ids\n",
    })
    errors = layer_errors(*collect_imports(root))
    assert len(errors) == 1
    assert "core/ids.py:3: miniray._private.core.ids (core) imports " \
           "miniray._private.owner.owner (owner): a higher layer" in errors[0]


def test_checker_resolves_relative_imports(tmp_path):
    root = _tree(tmp_path, {
        "_private/host/session.py": "from ..node import node\n",
        "_private/node/node.py": "from . import status\nfrom .status import x\n",
        "_private/node/status.py": "x = 1\n",
    })
    modules, imports = collect_imports(root)
    assert {(i.source, i.target) for i in imports} == {
        ("miniray._private.host.session", "miniray._private.node.node"),
        ("miniray._private.node.node", "miniray._private.node.status"),
    }
    errors = layer_errors(modules, imports)
    assert len(errors) == 1 and "session.py:1:" in errors[0] and "(host)" in errors[0]


def test_checker_fails_on_an_unplaced_module_and_a_public_import_of_the_engine(tmp_path):
    root = _tree(tmp_path, {
        "_private/loose.py": "",
        "_private/owner/actors.py": "",
        "actor.py": "import miniray._private.owner.actors\n",
    })
    errors = layer_errors(*collect_imports(root))
    assert any(e.startswith("miniray._private.loose: no layer") for e in errors)
    assert any("miniray.actor (top) imports miniray._private.owner.actors (owner): public"
               in e for e in errors)


def test_checker_finds_a_cycle_closed_by_a_lazy_import(tmp_path):
    root = _tree(tmp_path, {
        "_private/api.py": "from miniray._private import surface\n",
        "_private/surface.py": "def f():\n    import miniray._private.api\n",
        "_private/runtime.py": "",
    })
    modules, imports = collect_imports(root)
    assert layer_errors(modules, imports) == []  # same layer: only the cycle check sees it
    assert cycles(modules, imports) == [["miniray._private.api", "miniray._private.surface"]]


def test_checker_requires_a_reason_for_a_function_level_import(tmp_path):
    root = _tree(tmp_path, {
        "_private/core/ids.py": "x = 1\n",
        "exceptions.py": "class RayError(Exception): ...\n",
        "_private/api.py": """
            def a():
                from miniray._private.core import ids
            def b():
                # lazy: loaded on first use only
                from miniray._private.core import ids
            def c():
                from miniray.exceptions import RayError
        """,
    })
    errors = unexplained_lazy_imports(collect_imports(root)[1])
    assert len(errors) == 1 and "api.py:3:" in errors[0]


@pytest.mark.parametrize("module, layer", [
    ("miniray", "top"), ("miniray.exceptions", "core"), ("miniray.__main__", "cli"),
    ("miniray.util.queue", "top"), ("miniray._private.cli", "cli"),
    ("miniray._private.runtime", "top"), ("miniray._private.node.node", "node"),
    ("miniray._private.loose", None),
])
def test_layer_of(module, layer):
    assert layer_of(module) == layer
