"""The boundaries between the packages: ``import tuner`` stays light (no Ray, no SQLAlchemy), the
package surfaces still name everything they did, no module of ours uses another's private
names (``from x import _y``, ``x._y``), and none imports a module that imports it back."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "workers", "storage", "templates")
HEAVY = ("ray", "sqlalchemy", "alembic")

IMPORT_TUNER = """
import json, pkgutil, importlib, sys
heavy = {heavy!r}
loaded = lambda: sorted(m for m in heavy if m in sys.modules)
import tuner
after_import = loaded()
names = {{name: repr(getattr(tuner, name)) for name in tuner.__all__}}
after_names = loaded()
for module in pkgutil.walk_packages(tuner.__path__, "tuner."):
    if module.name != "tuner.__main__":
        importlib.import_module(module.name)
after_modules = loaded()
print(json.dumps(dict(after_import=after_import, after_names=after_names,
                      after_modules=after_modules, names=names,
                      bench=callable(tuner.bench) and tuner.bench.__module__,
                      usage=issubclass(tuner.UsageError, tuner.TunerError))))
"""


def test_import_tuner_imports_neither_ray_nor_sqlalchemy():
    script = IMPORT_TUNER.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    seen = json.loads(done.stdout)
    assert seen["after_import"] == []
    assert seen["after_names"] == []  # tuner.tune, tuner.best, ... resolved: still neither
    assert seen["after_modules"] == []  # every module of tuner/ imported: still neither
    assert set(seen["names"]) >= {"tune", "best", "export", "show", "studies", "bench",
                                  "record_landscape", "UsageError", "TunerError", "TuneResult"}
    assert seen["bench"] == "tuner.reports.bench" and seen["usage"]  # tuner.bench is the function


@pytest.mark.parametrize("package", ["tuner", "workers", "storage"])
def test_every_public_name_of_a_package_resolves_to_its_module(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert value is not None
        assert name in dir(module)
        home = getattr(value, "__module__", None)
        if home is not None and home.split(".")[0] == package:  # a class or a function of ours
            assert getattr(importlib.import_module(home), name) is value
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")


def test_the_surfaces_import_as_before():
    from storage import BestRecord, Repository, StorageError, default_url, open_repository, params_key
    from workers import FAILURE_KINDS, Measurement, NoGPUError, WorkerPool, compile_cubin

    assert params_key({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    assert WorkerPool.__module__ == "workers.pool" and "timeout" in FAILURE_KINDS
    assert all((BestRecord, Repository, StorageError, default_url, open_repository, Measurement,
                NoGPUError, compile_cubin))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_uses(source: str, module: str, package: str) -> list[str]:
    """Where ``module`` (its ``source``; ``package`` is the one relative imports start from) uses
    a private name of another module of ours: ``line: what``."""
    tree = ast.parse(source)
    found, bound = [], {}  # bound: a local name -> the module (or module.attr) of ours it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, origin] if origin else base)
            if not _ours(origin):
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {origin} import {alias.name}")
                bound[alias.asname or alias.name] = f"{origin}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain = _dotted(node.value)
            if chain and chain[0] in bound:
                owner = ".".join([bound[chain[0]], *chain[1:]])
                if owner != module:
                    found.append(f"{node.lineno}: {owner}.{node.attr}")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_no_module_uses_another_modules_private_names():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = _module_name(path)
            home = module if path.name == "__init__.py" else module.rpartition(".")[0]
            found += [f"{path.relative_to(ROOT)}:{use}"
                      for use in private_uses(path.read_text(), module, home)]
    assert found == []


def test_the_private_name_check_finds_both_forms():
    source = ("from tuner.api import _ray, tune\n"
              "import tuner.study.search as search\n"
              "from tuner.study import loop\n"
              "search._point_key({})\n"
              "loop._helper()\n"
              "tune._x\n"
              "from . import api\n"
              "api._space\n"
              "import tuner.reports.bench\n"
              "tuner.reports.bench._bench_rows\n"
              "self._own, optuna._x, templates_x._y\n")
    assert private_uses(source, "tuner.sample", "tuner") == [
        "1: from tuner.api import _ray", "4: tuner.study.search._point_key", "5: tuner.study.loop._helper",
        "6: tuner.api.tune._x", "8: tuner.api._space", "10: tuner.reports.bench._bench_rows"]
    assert private_uses("import tuner.reports.bench\ntuner.reports.bench._x\n", "tuner.reports.bench", "tuner") == []


# What would name a family in the service's own code: the built-in family and its one flag.
FAMILY_WORDS = ("attention", "causal")
# The modules of templates/ that every family shares (the contract and its short form), not a family.
CONTRACT = ("family", "simple", "tensors")


def _family_mentions(path: Path) -> list[str]:
    """Imports of a family's folder and string literals that name one, in code: docstrings (the
    examples of usage) and argparse help texts are prose, and migrations record what the schema
    was."""
    tree = ast.parse(path.read_text())
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            prose.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg == "help":
            prose.update(id(n) for n in ast.walk(node.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
            found += [f"{path}:{node.lineno}: import {n}" for n in names if n.startswith("templates.")
                      and n.split(".")[1] not in CONTRACT]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            found += [f"{path}:{node.lineno}: {node.value[:60]!r}" for word in FAMILY_WORDS if word in node.value]
    return found


def test_the_service_names_no_family():
    """tuner/, workers/ and storage/ work for any family: none imports a family's folder or
    special-cases one by name or by its flags."""
    paths = [p for package in ("tuner", "workers", "storage") for p in sorted((ROOT / package).rglob("*.py"))
             if "migrations" not in p.parts]
    found = [line for path in paths for line in _family_mentions(path)]
    assert found == []


def test_the_family_check_sees_what_it_looks_for(tmp_path):
    code = tmp_path / "m.py"
    code.write_text('"""About attention."""\nfrom templates.attention import peers\n'
                    'x = f(help="e.g. attention")\nif name == "attention":\n    flags = {"causal": True}\n')
    assert [line.split(": ", 1)[1] for line in _family_mentions(code)] == [
        "import templates.attention", "'attention'", "'causal'"]


# -- no import cycle ---------------------------------------------------------------------------

def _origin(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from ... import`` names, relative imports resolved from ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _lazy_names(tree: ast.Module, modules: Iterable[str]) -> dict[str, tuple[str, int]]:
    """A package's PEP 562 table (``_MODULES = {"workers.pool": ("WorkerPool",), ...}``): each
    name -> (the module it is imported from when first used, the table's line naming it)."""
    known, found = set(modules), {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and key.value in known and isinstance(value, (ast.Tuple, ast.List)):
                    found.update({name.value: (key.value, key.lineno) for name in value.elts
                                  if isinstance(name, ast.Constant) and isinstance(name.value, str)})
    return found


def import_graph(sources: Mapping[str, str], packages: Iterable[str]) -> dict[str, dict[str, int]]:
    """Which modules each module of ``sources`` (module -> its source; ``packages`` are the ones
    that are a package's ``__init__``) imports: module -> {imported module: first line}.

    Every import counts, wherever it is: at module level, inside a function (run time), under
    ``if TYPE_CHECKING:``, and ``importlib.import_module("a.b")`` with a literal name.

    - ``import a.b`` (``as x`` or not) is an edge to ``a.b``, and ``from a.b import y`` (``y`` not
      a module) an edge to ``a.b`` only: Python runs ``a/__init__`` first, but a package's
      ``__init__`` here only re-exports names, and counting it would make a false cycle of every
      module that imports a sibling.
    - ``from a import b`` where ``a.b`` is a module is an edge to ``a.b``.
    - ``from a import name`` where ``a/__init__`` re-exports ``name`` (an import in it, or its PEP
      562 table of names imported when first used) is an edge to the module that defines
      ``name``, found by parsing ``a/__init__`` (and the ``__init__`` it takes the name from, if
      that is one); only a name ``a/__init__`` defines itself is an edge to ``a``. So the
      re-export hub makes no false cycle: ``from workers import errors`` in ``workers/pool.py``
      is ``workers.pool -> workers.errors``, not ``workers.pool -> workers -> workers.pool``.
    - A package's ``__init__`` has an edge to every module it re-exports from, imported now or
      when first used; a plain ``import a`` is an edge to ``a/__init__``.
    """
    packages = set(packages)
    trees = {module: ast.parse(source) for module, source in sources.items()}
    exported: dict[str, dict[str, tuple[str, str]]] = {}

    def exports(package: str) -> dict[str, tuple[str, str]]:
        """What ``package``'s ``__init__`` re-exports: name -> (module, the name there)."""
        if package not in exported:
            tree = trees[package]
            found = {name: (home, name) for name, (home, _) in _lazy_names(tree, sources).items()}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and _origin(node, package, True) in sources:
                    found.update({alias.asname or alias.name: (_origin(node, package, True), alias.name)
                                  for alias in node.names if alias.name != "*"})
            exported[package] = found
        return exported[package]

    def home(origin: str, name: str, seen: frozenset = frozenset()) -> str:
        """The module that ``from origin import name`` really imports."""
        if f"{origin}.{name}" in sources:
            return f"{origin}.{name}"
        if origin in packages and name in exports(origin) and (origin, name) not in seen:
            module, real = exports(origin)[name]
            return home(module, real, seen | {(origin, name)})
        return origin

    graph: dict[str, dict[str, int]] = {}
    for module, tree in trees.items():
        edges = graph[module] = {}
        found: list[tuple[str, int]] = []
        if module in packages:
            found += list(_lazy_names(tree, sources).values())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                origin = _origin(node, module, module in packages)
                if origin in sources:
                    found += [(origin if alias.name == "*" else home(origin, alias.name), node.lineno)
                              for alias in node.names]
            elif isinstance(node, ast.Call) and (_dotted(node.func) or [""])[-1] == "import_module" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.args[0].value, node.lineno))
        for target, line in found:
            if target in sources and target != module:
                edges[target] = min(line, edges.get(target, line))
    return graph


def import_groups(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The sets of modules that import each other, directly or through others (the strongly
    connected parts of ``graph`` of more than one module), each sorted; [] when there is none."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {module: reach(module) for module in graph}
    groups, placed = [], set()
    for module in sorted(graph):
        if module not in placed and module in reached[module]:
            group = sorted(other for other in reached[module] if module in reached[other])
            placed.update(group)
            groups.append(group)
    return groups


def shortest_cycle(graph: Mapping[str, Mapping[str, int]], start: str) -> list[str]:
    """The shortest way of imports from ``start`` back to it, as [start, ..., start]; [] if none."""
    ways, todo = {start: [start]}, [start]
    while todo:  # breadth first
        here = todo.pop(0)
        for there in sorted(graph[here]):
            if there == start:
                return [*ways[here], start]
            if there not in ways:
                ways[there] = [*ways[here], there]
                todo.append(there)
    return []


def cycle_report(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """For each set of modules that import each other: the set, its shortest cycle from its
    first module, and every import between its modules (``module:line -> module``)."""
    report = []
    for group in import_groups(graph):
        cycle = shortest_cycle(graph, group[0])
        report.append(f"{len(group)} modules import each other: {', '.join(group)}\n"
                      f"    for one: {' -> '.join(f'{a}:{graph[a][b]}' for a, b in zip(cycle, cycle[1:]))}"
                      f" -> {cycle[0]}\n"
                      + "".join(f"    {a}:{line} -> {b}\n" for a in group
                                for b, line in sorted(graph[a].items()) if b in group))
    return report


def _our_sources() -> tuple[dict[str, str], set[str]]:
    paths = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    return ({_module_name(path): path.read_text() for path in paths},
            {_module_name(path) for path in paths if path.name == "__init__.py"})


def test_no_module_imports_one_that_imports_it_back():
    """No module of tuner/, workers/, storage/ or templates/ imports, directly or through
    others, a module that imports it back: counting imports inside functions and under
    ``TYPE_CHECKING`` (``import_graph`` says what counts as an import of what)."""
    report = cycle_report(import_graph(*_our_sources()))
    assert not report, "\n" + "".join(report)


def test_the_import_graph_counts_every_import_and_no_reexport():
    sources = {
        "pkg": "from pkg.a import A\n_MODULES = {'pkg.b': ('B',), 'pkg.c': ('C', 'C2')}\n",
        "pkg.a": "from pkg import B\n",                        # re-exported: pkg.b, not pkg
        "pkg.b": "def f():\n    from . import c\n",             # a submodule, relative, run time
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import A\n",
        "pkg.d": "import importlib\nimport pkg.a as alias\nimportlib.import_module('pkg.e')\n",
        "pkg.e": "import pkg\nfrom pkg.sub import S\nimport os, sys\n",
        "pkg.sub": "from pkg.sub.x import S\n",
        "pkg.sub.x": "from .. import C2\nfrom ...outside import y\n",
    }
    graph = import_graph(sources, packages=["pkg", "pkg.sub"])
    assert {module: sorted(edges) for module, edges in graph.items()} == {
        "pkg": ["pkg.a", "pkg.b", "pkg.c"], "pkg.a": ["pkg.b"], "pkg.b": ["pkg.c"],
        "pkg.c": ["pkg.a"], "pkg.d": ["pkg.a", "pkg.e"], "pkg.e": ["pkg", "pkg.sub.x"],
        "pkg.sub": ["pkg.sub.x"], "pkg.sub.x": ["pkg.c"]}
    assert graph["pkg"] == {"pkg.a": 1, "pkg.b": 2, "pkg.c": 2}
    assert graph["pkg.c"] == {"pkg.a": 3} and graph["pkg.b"] == {"pkg.c": 2}
    assert import_groups(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert shortest_cycle(graph, "pkg.a") == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert cycle_report(graph) == [
        "3 modules import each other: pkg.a, pkg.b, pkg.c\n"
        "    for one: pkg.a:1 -> pkg.b:2 -> pkg.c:3 -> pkg.a\n"
        "    pkg.a:1 -> pkg.b\n    pkg.b:2 -> pkg.c\n    pkg.c:3 -> pkg.a\n"]
    assert import_groups({"x": {"y": 1}, "y": {}}) == [] and cycle_report({"x": {}}) == []
    two = {"x": {"y": 1, "z": 1}, "y": {"x": 2}, "z": {"w": 1}, "w": {"z": 1}}
    assert import_groups(two) == [["w", "z"], ["x", "y"]] and shortest_cycle(two, "x") == ["x", "y", "x"]
