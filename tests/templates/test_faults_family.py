"""The fault family (docs/examples/faults), without a GPU: each fault is where it should be in
the source and the launch, compiles (or, for compile_error, does not), the starting points put
every fault between healthy configs, its checks refuse NaN and a wrong output, and its
worker_killed hook kills the process that validates the marked output."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from templates import get_family
from templates.family import H100_LIMITS, check_outputs

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "examples" / "faults"
FAMILY = get_family(str(FOLDER))
PROBLEM = FAMILY.parse_problem("100000", "fp32")


def _module():
    return __import__(type(FAMILY).__module__, fromlist=["EXPECTED"])


def test_every_fault_is_a_valid_config_and_a_starting_point_between_healthy_ones():
    expected = _module().EXPECTED
    assert set(expected) == {"oob_write", "trap", "infinite_loop", "smem_overflow", "compile_error",
                             "nan_output", "writes_inputs", "worker_killed"}
    points = FAMILY.starting_points(PROBLEM, H100_LIMITS)
    faults = [p["FAULT"] for p in points]
    assert len(points) == 17 and sorted(f for f in faults if f != "none") == sorted(expected)
    assert faults[0] == "none" and all(faults[i] == "none" for i in range(0, 17, 2))
    assert len({tuple(sorted(p.items())) for p in points}) == 17  # no config twice
    assert all(FAMILY.check(p, PROBLEM, H100_LIMITS) is None for p in points)
    assert FAMILY.launch(dict(FAULT="smem_overflow", BLOCK=256, ITEMS=1), PROBLEM).smem_bytes > \
        H100_LIMITS.max_smem_per_block_optin
    with pytest.raises(ValueError):
        FAMILY.parse_problem("4,4", "fp32")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_each_fault_compiles_except_the_compile_error_and_the_overflow_is_screened(tmp_path):
    from workers.compile import compile_cubin
    from workers.compile_task import screen
    from workers.errors import CompileError
    from workers.results import CompileRequest

    for fault in _module().FAULTS:
        params = dict(FAULT=fault, BLOCK=256, ITEMS=2)
        launch = FAMILY.launch(params, PROBLEM)
        request = CompileRequest(FAMILY.render(params, PROBLEM), launch.kernel, ())
        if fault == "compile_error":
            with pytest.raises(CompileError, match="#error"):
                compile_cubin(request, cache_dir=tmp_path)
            continue
        binary = compile_cubin(request, cache_dir=tmp_path)
        why = screen(binary, 256, launch, H100_LIMITS)
        if fault == "smem_overflow":
            assert why is not None and "shared memory" in why
        else:
            assert why is None, (fault, why)


def test_its_checks_accept_a_right_output_and_refuse_nan_and_wrong_ones():
    inputs = FAMILY.inputs(PROBLEM, seed=1)
    right = (np.float32(2.5) * inputs["x"]).astype(np.float32)
    assert check_outputs(FAMILY, PROBLEM, inputs, {"y": right}).ok
    nan = right.copy()
    nan[7::1000] = np.nan
    refused = check_outputs(FAMILY, PROBLEM, inputs, {"y": nan})
    assert not refused.ok and "NaN" in refused.reason
    wrong = right * np.float32(1.01)
    assert not check_outputs(FAMILY, PROBLEM, inputs, {"y": wrong}).ok


def test_the_kill_marker_kills_the_process_that_validates_it():
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
              "import numpy as np\n"
              "from templates import get_family\n"
              f"fam = get_family({str(FOLDER)!r})\n"
              "p = fam.parse_problem('1000', 'fp32')\n"
              "x = fam.inputs(p, 0)\n"
              "y = (np.float32(2.5) * x['x']).astype(np.float32)\n"
              "assert fam.validate(p, x, {'y': y}).ok\n"
              "y[0] = -4242.0\n"
              "fam.validate(p, x, {'y': y})\n"
              "print('still alive')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9 and "still alive" not in done.stdout, done.stderr
