"""The packages' import graph, read from the source (AST), has no cycle, and every import runs
down the floors of :data:`FLOORS` (the rooms of ``variants/`` and the packages below them).

Every ``import`` and ``from ... import`` counts, at module level or inside a function (a lazy
import is still a dependency: it only moves the failure to the first call). ``from pkg import
name`` is an edge to ``pkg.name`` when that is a module of the packages, else to ``pkg``.
Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those implicit edges are not
counted (a package's face may re-export what lies below it).
"""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("variants", "metrics", "runs", "contracts")


def modules(root=ROOT, packages=PACKAGES):
    """{dotted module name: path} of every ``.py`` file under ``packages``."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _nearest(name, mods):
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name, path, mods):
    """The modules of ``mods`` that module ``name`` (file ``path``) imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_nearest(a.name, mods) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                found.add(full if full in mods else _nearest(base, mods))
    found.discard(None)
    found.discard(name)
    return found


@functools.lru_cache(maxsize=None)
def import_graph(root=ROOT, packages=PACKAGES):
    """{module: set of modules it imports} inside ``packages``."""
    mods = modules(root, packages)
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def cycles(graph):
    """The strongly connected components of ``graph`` with more than one module (Tarjan), each
    a sorted list; a module importing itself is not in the graph."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_are_edges(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom .c import X\n")
    (pkg / "sub" / "c.py").write_text("X = 1\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a", "pkg.sub.c"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_the_package(package):
    graph = import_graph()
    inside = {m: {t for t in ts if t.split(".")[0] == package}
              for m, ts in graph.items() if m.split(".")[0] == package}
    assert len(inside) >= 3  # the package was read
    assert cycles(inside) == [], "import cycles (each a set of modules importing each other)"


def test_no_import_cycle_across_the_packages():
    assert cycles(import_graph()) == []


#: the floors, bottom first: a module imports only from a lower floor or its own room (a room is
#: a package of the repository or a sub-package of ``variants``; rooms on one floor do not import
#: each other). ``variants/__init__.py``, the package's face, is left out. docs/architecture.md
#: draws the same table.
FLOORS = (
    ("metrics",),
    ("contracts", "variants.layer_maps", "variants.defaults"),
    ("runs",),
    ("variants.runtime", "variants.datasets"),
    ("variants.arch", "variants.executors"),
    ("variants.checkpoints", "variants.models"),
    ("variants.onnx",),
    ("variants.families",),
    ("variants.sweep",),
    ("variants.search", "variants.export"),
    ("variants.commands",),
    ("variants.cli",),
    ("variants.__main__",),
)


def room_of(module, floors=FLOORS):
    """The room of ``module``: the longest entry of ``floors`` it is or lies in (None if none)."""
    rooms = [r for floor in floors for r in floor if module == r or module.startswith(r + ".")]
    return max(rooms, key=len) if rooms else None


def upward(graph, floors=FLOORS):
    """[(module, imported)] of imports into another room on the same or a higher floor."""
    level = {room: i for i, floor in enumerate(floors) for room in floor}
    out = []
    for m, targets in graph.items():
        if m == "variants":
            continue
        for t in targets:
            a, b = room_of(m, floors), room_of(t, floors)
            if t != "variants" and a != b and level[b] >= level[a]:
                out.append((m, t))
    return sorted(out)


def test_the_floor_check_sees_imports_that_run_up_or_sideways():
    floors = (("low",), ("mid", "side"), ("top",))
    graph = {"top.a": {"mid.b", "low.c"}, "mid.b": {"low.c", "mid.d"}, "mid.d": set(),
             "low.c": {"top.a"}, "side.e": {"mid.b"}}
    assert upward(graph, floors) == [("low.c", "top.a"), ("side.e", "mid.b")]


def test_every_module_has_a_room():
    assert [m for m in import_graph() if m != "variants" and room_of(m) is None] == []


def test_imports_only_go_down_the_floors():
    assert upward(import_graph()) == [], "imports that run up (or sideways) the floors"
