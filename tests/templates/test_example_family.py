"""The example family of docs/FAMILIES.md (docs/examples/row_softmax), found by its path as a
user's family is: it renders and compiles, its checks accept a right output and refuse wrong
ones, and the tuner takes it by path."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cores

from templates import get_family
from templates.elements import from_bits, to_bits
from templates.family import H100_LIMITS, check_outputs
from templates.simple import ELEMENTS

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "examples" / "row_softmax"
FAMILY = get_family(str(FOLDER))


def test_it_is_found_by_path_and_refuses_what_it_cannot_do():
    assert FAMILY.name == "row_softmax" and get_family(str(FOLDER)) is FAMILY
    problem = FAMILY.parse_problem("37,1000", "bf16")
    assert problem.key == "37x1000-bf16" and problem.flags == ()
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    assert valid and all(1000 % c["VEC"] == 0 for c in valid)
    assert FAMILY.check(dict(THREADS=256, ROWS=1, VEC=8), FAMILY.parse_problem("4,1001", "fp16"), H100_LIMITS) \
        .startswith("divisibility")
    for shape, dtype in (("4", "fp16"), ("4,0", "fp16"), ("4,8", "fp32")):
        with pytest.raises(ValueError):
            FAMILY.parse_problem(shape, dtype)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_configs_compile_without_spilling(tmp_path):
    from workers.results import CompileRequest

    problems = [FAMILY.parse_problem("37,1000", dtype) for dtype in ("fp16", "bf16")]
    jobs = [(problem, params) for problem in problems for params in FAMILY.valid_configs(problem, H100_LIMITS)[::23]]
    requests = [CompileRequest(FAMILY.render(params, problem), "row_softmax", FAMILY.compile_options(params, problem))
                for problem, params in jobs]
    for (_, params), binary in zip(jobs, cores.compile_each(requests, tmp_path)):
        assert binary.resources.spill_stores == 0 and binary.resources.stack_bytes == 0, params


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="its inputs and reference need torch")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_its_checks_accept_a_right_output_and_refuse_wrong_ones(dtype):
    problem = FAMILY.parse_problem("37,1000", dtype)
    inputs = FAMILY.inputs(problem, seed=3)
    x = from_bits(inputs["x"], dtype)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    right = to_bits(e / e.sum(axis=1, keepdims=True), dtype)
    assert check_outputs(FAMILY, problem, inputs, {"y": right}).ok
    assert not check_outputs(FAMILY, problem, inputs, {"y": to_bits(e / e.sum(), dtype)}).ok
    hole = right.copy()
    hole[36, 999] = ELEMENTS[dtype][1]  # the last element of the last row, unwritten
    assert "unwritten" in check_outputs(FAMILY, problem, inputs, {"y": hole}).reason


def test_the_command_line_takes_it_by_path(tmp_path):
    from storage import open_repository

    open_repository(f"sqlite:///{tmp_path / 't.db'}").close()  # an empty database, not a missing one
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TUNER_DB", None)
    done = subprocess.run([sys.executable, "-m", "tuner", "best", str(FOLDER), "--shape", "64,512", "--dtype",
                           "fp16", "--db", f"sqlite:///{tmp_path / 't.db'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no validated result stored for row_softmax 64x512-fp16" in done.stderr


def test_it_tunes_end_to_end_by_replay(tmp_path):
    """A study of the example family, by its path, answered by its landscape recorded on an H200
    (every one of its 80 configs of 4096x1000 fp16, measured by `tuner tune --sampler grid`)."""
    import tuner

    landscape = ROOT / "tests" / "data" / "row_softmax_4096x1000-fp16_h200.json"
    db = f"sqlite:///{tmp_path / 'replay.db'}"
    result = tuner.tune(str(FOLDER), "4096,1000", "fp16", trials=30, replay=landscape, db=db, seed=0)
    assert result.status == "finished" and result.measured == 30 and result.failed == 0
    recorded = json.loads(landscape.read_text())["entries"]
    fastest = min(e["measurement"]["timing"]["median_ms"] for e in recorded if e["measurement"]["ok"])
    assert result.best.median_ms <= 1.05 * fastest  # the starting points and TPE find it in 30 of 80
    assert tuner.best(str(FOLDER), "4096,1000", "fp16", db=db).params == result.best.params


def test_bench_search_takes_a_family_by_path():
    from tuner.errors import UsageError
    from tuner.reports.bench_search import bench_search

    landscape = ROOT / "tests" / "data" / "row_softmax_4096x1000-fp16_h200.json"
    with pytest.raises(UsageError, match="unknown kernel family 'row_softmax'"):
        bench_search([landscape], seeds=1, samplers=["random"])
    report = bench_search([landscape], seeds=2, samplers=["random", "tpe-start"], family=str(FOLDER))
    assert set(report.samplers) == {"random", "tpe-start"} and report.space_size == 80
    with pytest.raises(UsageError, match="recorded for family 'row_softmax', not 'attention'"):
        bench_search([landscape], seeds=1, samplers=["random"], family="attention")
