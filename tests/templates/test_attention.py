"""The attention family on the CPU: space, constraints, rendering, compiling, reference."""

from __future__ import annotations

import math
import random
import shutil

import numpy as np
import pytest

from templates import get_family
from templates.attention import problem as attn
from templates.attention import space
from templates.family import H100_LIMITS, DeviceLimits, TemplateError, check_outputs, summarize_space

FAMILY = get_family("attention")
PROBLEMS = [
    FAMILY.parse_problem(shape, dtype, causal)
    for shape in ("2,3,1000,64", "1,2,4097,128")
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_every_config_renders_or_is_rejected_with_a_reason(problem):
    rendered = 0
    for config in FAMILY.configs():
        reason = FAMILY.check(config, problem, H100_LIMITS)
        if reason is not None:
            assert reason.split(":")[0] in {"divisibility", "shared memory", "registers", "layout", "threads", "arch"}
            continue
        source = FAMILY.render(config, problem)
        assert "attention_fwd" in source and "{{" not in source and "/*%" not in source
        assert f"#define BLOCK_M {config['BLOCK_M']}" in source
        assert ("bf16.bf16" in source) == (problem.dtype == "bf16")
        assert f"#define CAUSAL {int(problem.causal)}" in source
        rendered += 1
    assert rendered > 100


def test_constraints_reject_what_cannot_fit():
    problem = FAMILY.parse_problem("1,1,4096,128", "fp16")
    big = dict(BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, STAGES=3, SMEM_LAYOUT="pad16", WARP_SPECIALIZED=0, Q_IN_REGS=0,
               MMA="sync")
    assert FAMILY.check(big, problem, H100_LIMITS).startswith("shared memory")
    assert space.smem_bytes(big, 128) > H100_LIMITS.max_smem_per_block_optin
    indivisible = dict(big, BLOCK_M=64, NUM_WARPS=8, STAGES=1)
    assert FAMILY.check(indivisible, problem, H100_LIMITS).startswith("divisibility")
    greedy = dict(big, BLOCK_M=128, NUM_WARPS=4, STAGES=1, Q_IN_REGS=1)  # two m-tiles, D=128, BN=128
    assert FAMILY.check(greedy, problem, H100_LIMITS).startswith("registers")
    small_gpu = DeviceLimits("tiny", (9, 0), 1, max_smem_per_block_optin=48 * 1024)
    fits = dict(big, STAGES=1, SMEM_LAYOUT="swizzle", BLOCK_N=64, Q_IN_REGS=0)
    assert FAMILY.check(fits, problem, H100_LIMITS) is None
    assert FAMILY.check(fits, problem, small_gpu).startswith("shared memory")


def test_space_summary_counts_valid_and_rejected():
    summary = summarize_space(FAMILY, FAMILY.parse_problem("4,16,4096,128", "fp16"), H100_LIMITS)
    assert summary.total == math.prod(len(p.choices) for p in FAMILY.params)
    assert 0 < summary.valid < summary.total
    assert summary.valid + sum(summary.reasons.values()) == summary.total


@pytest.mark.parametrize(
    "shape, dtype, message",
    [
        ("4,16,4096", "fp16", "malformed shape"),
        ("4,16,x,128", "fp16", "malformed shape"),
        ("4,16,0,128", "fp16", "malformed shape"),
        ("4,16,4096,96", "fp16", "unsupported head dimension"),
        ("4,16,4096,128", "fp32", "unsupported dtype"),
    ],
)
def test_bad_problems_fail_with_one_line(shape, dtype, message):
    with pytest.raises(TemplateError, match=message) as info:
        FAMILY.parse_problem(shape, dtype)
    assert "\n" not in str(info.value)


def test_unknown_parameter_values_are_refused():
    problem = PROBLEMS[0]
    with pytest.raises(TemplateError, match="BLOCK_N=48"):
        FAMILY.render(dict(FAMILY.default_params(), BLOCK_N=48), problem)
    with pytest.raises(TemplateError, match="unknown kernel family"):
        get_family("softmax")


def test_launch_geometry_covers_every_row():
    problem = FAMILY.parse_problem("3,5,4097,64", "bf16", causal=True)
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, WARP_SPECIALIZED=1)
    launch = FAMILY.launch(params, problem)
    assert launch.grid == (math.ceil(4097 / 128), 5, 3)
    assert launch.block == (9 * 32, 1, 1)
    assert launch.smem_bytes == space.smem_bytes(params, 64)
    assert [a.kind for a in launch.args] == ["buffer"] * 4 + ["i32", "f32"]
    assert launch.args[5].value == pytest.approx(math.log2(math.e) / 8)


def test_problems_that_share_d_dtype_and_causal_share_each_configs_source():
    """B, H and S are kernel arguments: one source, one cubin in the compile cache, for them all."""
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8)
    one, other = (FAMILY.parse_problem(shape, "fp16", True) for shape in ("2,8,1024,64", "1,16,4097,64"))
    assert FAMILY.render(params, one) == FAMILY.render(params, other)
    assert FAMILY.launch(params, one).grid != FAMILY.launch(params, other).grid
    for changed in (FAMILY.parse_problem("2,8,1024,64", "bf16", True),
                    FAMILY.parse_problem("2,8,1024,64", "fp16", False),
                    FAMILY.parse_problem("2,8,1024,128", "fp16", True)):
        assert FAMILY.render(params, changed) != FAMILY.render(params, one)


def test_template_hash_is_stable_and_names_the_version():
    assert FAMILY.template_hash == get_family("attention").template_hash
    assert len(FAMILY.template_hash) == 16


# -- the reference ------------------------------------------------------------------------------
def _exact_output(problem, inputs):
    """A float64 attention of the whole problem, rounded to the element type: a correct kernel."""
    out = np.empty(problem.shape)
    for b in range(problem.shape[0]):
        for h in range(problem.shape[1]):
            q, k, v = (attn.from_bits(inputs[n][b, h], problem.dtype) for n in ("q", "k", "v"))
            out[b, h] = attn.reference_rows(q, k, v, np.arange(problem.shape[2]), problem.causal)
    return attn.to_bits(out.astype(np.float32), problem.dtype)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_validate_accepts_a_correct_output_and_rejects_broken_ones(dtype, causal):
    problem = FAMILY.parse_problem("2,2,77,64", dtype, causal)
    inputs = FAMILY.inputs(problem, seed=3)
    assert all(np.any(x != 0) for x in inputs.values())
    good = _exact_output(problem, inputs)
    result = FAMILY.validate(problem, inputs, {"o": good})
    assert result.ok and result.error < attn.TOLERANCE[dtype] / 4
    kept = FAMILY.reference(problem, inputs)  # what a worker computes once per problem
    assert FAMILY.validate(problem, inputs, {"o": good}, kept) == result

    unwritten = good.copy()
    unwritten[1, 1, 76, 5] = attn.POISON[dtype]
    result = check_outputs(FAMILY, problem, inputs, {"o": unwritten})
    assert not result.ok and result.reason == "1 element of 'o' is NaN/Inf or unwritten"
    assert check_outputs(FAMILY, problem, inputs, {"o": good}).ok

    wrong = attn.to_bits(attn.from_bits(good, dtype).astype(np.float32) * 1.2, dtype)
    result = FAMILY.validate(problem, inputs, {"o": wrong})
    assert not result.ok and "relative error" in result.reason

    # causal vs non-causal outputs differ: validating one against the other's reference fails
    other = FAMILY.parse_problem("2,2,77,64", dtype, not causal)
    assert not FAMILY.validate(other, inputs, {"o": good}).ok


def test_bf16_bits_round_trip():
    exact = np.array([1.0, -2.5, 3.140625, 65536.0], dtype=np.float32)
    assert np.array_equal(attn.from_bits(attn.to_bits(exact, "bf16"), "bf16"), exact.astype(np.float64))
    ties = np.array([1.00390625, 1.01171875], dtype=np.float32)  # halfway: round to even
    assert attn.from_bits(attn.to_bits(ties, "bf16"), "bf16").tolist() == [1.0, 1.015625]


# -- compiling for sm_90a (CPU only) -------------------------------------------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_sample_of_configs_compiles_for_sm90a_and_reports_resources(tmp_path):
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    rng = random.Random(7)
    problems = [FAMILY.parse_problem("2,4,1000,64", "fp16", True), FAMILY.parse_problem("1,2,4097,128", "bf16")]
    for problem in problems:
        valid = FAMILY.valid_configs(problem, H100_LIMITS)
        sample = rng.sample(valid, 3)
        sample.append(next(c for c in valid if c["WARP_SPECIALIZED"] == 1 and c["STAGES"] == 3))
        for params in sample:
            request = CompileRequest(
                FAMILY.render(params, problem), "attention_fwd", FAMILY.compile_options(params, problem)
            )
            binary = compile_cubin(request, cache_dir=tmp_path)
            assert binary.cubin[:4] == b"\x7fELF"
            assert binary.resources is not None and 32 <= binary.resources.registers <= 255, params


def test_starting_points_are_valid_and_lead_with_the_warpgroup_tiles():
    for shape, dtype, causal in FAMILY.suite:
        problem = FAMILY.parse_problem(shape, dtype, causal)
        points = FAMILY.starting_points(problem, H100_LIMITS)
        assert points and all(FAMILY.check(p, problem, H100_LIMITS) is None for p in points)
        assert points[0]["MMA"] == "wgmma" and any(p["MMA"] == "sync" for p in points)
        first = (points[0]["STAGES"], points[0]["Q_IN_REGS"])
        assert first == ((3, 1) if problem.shape[3] == 128 else (2, 0))  # D=128 leads with its own
        assert len({tuple(sorted(p.items())) for p in points}) == len(points)
    older = DeviceLimits("sm80", (8, 0), 108, max_smem_per_block_optin=163 * 1024)
    assert all(p["MMA"] == "sync" for p in FAMILY.starting_points(PROBLEMS[0], older))


def test_inputs_are_the_same_whatever_the_threads(monkeypatch):
    problem = FAMILY.parse_problem("2,3,1000,64", "bf16")
    monkeypatch.setattr(attn, "INPUT_BLOCK", 4096)  # many blocks on a small problem
    many = FAMILY.inputs(problem, seed=7)
    monkeypatch.setattr(attn.os, "cpu_count", lambda: 1)
    one = FAMILY.inputs(problem, seed=7)
    assert all(np.array_equal(many[n], one[n]) for n in ("q", "k", "v"))
    assert not np.array_equal(many["q"], FAMILY.inputs(problem, seed=8)["q"])
    assert not np.array_equal(many["q"], many["k"])
    values = attn.from_bits(many["v"], "bf16")
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1) < 0.02
