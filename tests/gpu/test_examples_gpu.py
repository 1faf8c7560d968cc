"""The short-form examples (docs/examples) tuned for real by their folders, every measured config
right, and each winner right at odd sizes (1 row, 1,000,001 rows, a hidden size of 4,097).

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_examples_gpu.py`` (torch needed).
Skipped where no GPU is visible.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
CASES = {  # the tuned problem, then the odd sizes
    "row_softmax": (("4096,1000", "fp16"), [("1,1000", "fp16"), ("1000001,64", "bf16"), ("37,4097", "fp16")]),
    "silu_mul": (("4096,11008", "bf16"), [("1,4097", "bf16"), ("1000001,128", "fp16"), ("37,4097", "bf16")]),
    "rmsnorm": (("4096,8192", "bf16"), [("1,4096", "bf16"), ("1000001,256", "bf16"), ("4096,4097", "fp16")]),
    "transpose": (("8192,8192", "fp32"), [("1,4097", "fp32"), ("1000001,7", "fp32"), ("4097,4097", "fp32")]),
}


@pytest.mark.parametrize("example", list(CASES))
def test_the_example_tunes_and_its_winner_is_right_at_odd_sizes(tmp_path, example):
    pytest.importorskip("torch")
    import tuner
    from templates import get_family
    from templates.family import H100_LIMITS
    from workers.local import LocalBench

    folder = str(EXAMPLES / example)
    (shape, dtype), odd = CASES[example]
    result = tuner.tune(folder, shape, dtype, trials=30, db=f"sqlite:///{tmp_path / 'ex.db'}", seed=0)
    family = get_family(folder)
    space = len(family.valid_configs(family.parse_problem(shape, dtype), H100_LIMITS))
    assert result.best is not None and result.measured == min(30, space), result  # transpose: 26 valid
    assert result.failed == 0, result  # every valid config computes the reference's outputs
    winner = dict(result.best.params)
    configs = []
    for odd_shape, odd_dtype in odd:
        problem = family.parse_problem(odd_shape, odd_dtype)
        valid = family.valid_configs(problem, H100_LIMITS)
        configs.append((problem, min(valid, key=lambda c: sum(c[k] != winner[k] for k in c))))
    with LocalBench() as bench:
        assert bench.failures(family, configs) == []


def test_a_wrong_kernel_fails_the_checks_on_the_gpu(tmp_path):
    """The short form's checks on device memory: a kernel that leaves the last row's last element
    alone is unwritten; one that scales the last row is wrong in that row."""
    pytest.importorskip("torch")
    from templates import get_family
    from workers.local import LocalBench

    family = get_family(str(EXAMPLES / "silu_mul"))
    problem = family.parse_problem("1000001,128", "bf16")
    params = dict(THREADS=256, VEC=8, ITEMS=1)
    source = family.render(params, problem)
    skip_last = source.replace("if (v < total) {", "if (v < total - 1) {")
    scale_last = source.replace("r.e[e] = from_float(g", "r.e[e] = from_float((row == rows - 1 ? 1.5f : 1.f) * g")
    assert skip_last != source and scale_last != source
    launch, options = family.launch(params, problem), family.compile_options(params, problem)
    with LocalBench() as bench:
        assert bench.measure(family, problem, source, launch, options).ok
        unwritten = bench.measure(family, problem, skip_last, launch, options)
        assert not unwritten.ok and "unwritten" in unwritten.reason
        wrong = bench.measure(family, problem, scale_last, launch, options)
        assert not wrong.ok and wrong.reason.startswith("row 1000000 of 'out'"), wrong.reason
