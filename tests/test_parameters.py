"""No function of ours takes more than a handful of parameters: settings travel as frozen
options objects (``StudyOptions``, ``PoolOptions``, ``TimingOptions``, ``StudySpec``), built
once where a call comes in and passed whole. Every parameter counts: ``self``, keyword-only
ones, and ``*args`` and ``**kwargs`` one each."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "workers", "storage")
MOST = 10
# The study's path, from tuner.tune to the GPU: its functions take fewer still.
STUDY_PATH = ("tuner/api.py", "tuner/study/", "workers/pool.py", "workers/pool_options.py")
STUDY_PATH_FUNCTIONS = {("workers/gpu.py", "measure"), ("workers/kernel_run.py", "run"),
                        ("storage/repository.py", "open_study")}
STUDY_MOST = 8


def count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = function.args
    return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            + (a.vararg is not None) + (a.kwarg is not None))


def functions() -> list[tuple[str, int, str, int]]:
    """(path, line, name, parameters) of every function in the packages."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((relative, node.lineno, node.name, count(node)))
    return found


def on_study_path(path: str, name: str) -> bool:
    return path.startswith(STUDY_PATH) or (path, name) in STUDY_PATH_FUNCTIONS


def test_no_function_takes_more_than_ten_parameters():
    over = [f"{path}:{line} {name} ({n})" for path, line, name, n in functions() if n > MOST]
    assert over == []


def test_no_function_on_the_study_path_takes_more_than_eight():
    over = [f"{path}:{line} {name} ({n})" for path, line, name, n in functions()
            if n > STUDY_MOST and on_study_path(path, name)]
    assert over == []


def test_the_count_takes_every_kind_of_parameter():
    tree = ast.parse("def f(a, /, b, *c, d, e=1, **f): pass")
    assert count(tree.body[0]) == 6
