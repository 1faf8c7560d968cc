"""The boundaries between the packages: ``import tuner`` stays light (no Ray, no SQLAlchemy), the
package surfaces still name everything they did, and no module of ours uses another's private
names (``from x import _y``, ``x._y``)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

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
for module in pkgutil.iter_modules(tuner.__path__):
    if module.name != "__main__":
        importlib.import_module("tuner." + module.name)
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
    assert seen["bench"] == "tuner.bench" and seen["usage"]  # tuner.bench is the function


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
              "import tuner.search as search\n"
              "from tuner import loop\n"
              "search._point_key({})\n"
              "loop._helper()\n"
              "tune._x\n"
              "from . import api\n"
              "api._space\n"
              "import tuner.bench\n"
              "tuner.bench._bench_rows\n"
              "self._own, optuna._x, templates_x._y\n")
    assert private_uses(source, "tuner.sample", "tuner") == [
        "1: from tuner.api import _ray", "4: tuner.search._point_key", "5: tuner.loop._helper",
        "6: tuner.api.tune._x", "8: tuner.api._space", "10: tuner.bench._bench_rows"]
    assert private_uses("import tuner.bench\ntuner.bench._x\n", "tuner.bench", "tuner") == []


# What would name a family in the service's own code: the built-in family and its one flag.
FAMILY_WORDS = ("attention", "causal")


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
                      and n.split(".")[1] not in ("family",)]
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
