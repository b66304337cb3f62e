"""The packages' import graph, read from the source (AST), has no cycle.

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
