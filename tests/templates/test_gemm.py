"""The GEMM family on the CPU: problems, space, constraints, rendering, compiling, reference."""

from __future__ import annotations

import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from templates import families, get_family
from templates.family import H100_LIMITS, DeviceLimits, Problem, TemplateError, check_outputs
from templates.gemm import problem as gemm
from templates.gemm import render, space, starts
import cores
from whole_space import whole_product

FAMILY = get_family("gemm")
ROOT = Path(__file__).resolve().parents[2]
REASONS = {"divisibility", "tile", "threads", "shared memory", "registers", "path", "arch", "wgmma", "tma", "split-K",
           "persistent", "cluster", "swap", "pingpong"}


def _problem(shape="1000,17,4097", dtype="fp16", layout="nn", epilogue="none"):
    return FAMILY.parse_problem(shape, dtype, {"layout": layout, "epilogue": epilogue})


# -- problems -----------------------------------------------------------------------------------
def test_the_family_is_registered_and_its_problems_carry_their_flags():
    assert "gemm" in families() and FAMILY.name == "gemm"
    problem = _problem("4096,4096,4096", "bf16", "nt", "bias_gelu")
    assert problem.shape == (4096, 4096, 4096)
    assert problem.flags == (("epilogue", "bias_gelu"), ("layout", "nt"))
    assert problem.key == "4096x4096x4096-bf16-epilogue=bias_gelu-layout=nt"
    assert problem.spec == {"shape": [4096, 4096, 4096], "dtype": "bf16",
                            "flags": {"epilogue": "bias_gelu", "layout": "nt"}}
    assert FAMILY.problem_from_spec(problem.spec) == problem
    tanh = _problem("4096,4096,4096", "bf16", "nt", "bias_gelu_tanh")
    assert tanh.key == "4096x4096x4096-bf16-epilogue=bias_gelu_tanh-layout=nt"
    assert FAMILY.problem_from_spec(tanh.spec) == tanh and FAMILY.distance(problem, tanh) == math.inf
    assert FAMILY.parse_problem("64x32x16", "fp16") == Problem((64, 32, 16), "fp16", (("epilogue", "none"),
                                                                                        ("layout", "nn")))
    assert FAMILY.flops(problem) == 2 * 4096**3
    assert FAMILY.min_bytes(_problem("10,20,30")) == 2 * (10 * 30 + 30 * 20 + 10 * 20)


@pytest.mark.parametrize(
    "shape, dtype, flags, message",
    [
        ("4096,4096", "fp16", {}, "malformed shape"),
        ("4096,x,4096", "fp16", {}, "malformed shape"),
        ("4096,0,4096", "fp16", {}, "malformed shape"),
        ("65536,65536,16", "fp16", {}, "too large"),
        ("64,64,64", "fp32", {}, "unsupported dtype"),
        ("64,64,64", "fp16", {"layout": "tx"}, "flag layout='tx' is not one of"),
        ("64,64,64", "fp16", {"epilogue": "relu"}, "flag epilogue='relu' is not one of"),
        ("64,64,64", "fp16", {"causal": True}, "unknown problem flag 'causal'"),
    ],
)
def test_bad_problems_fail_with_one_line(shape, dtype, flags, message):
    with pytest.raises(TemplateError, match=message) as info:
        FAMILY.parse_problem(shape, dtype, flags)
    assert "\n" not in str(info.value)


def test_distance_is_log2_in_each_dimension_for_the_same_dtype_and_flags():
    one = _problem("1024,4096,4096", "bf16", "nt")
    assert FAMILY.distance(one, one) == 0
    assert FAMILY.distance(one, _problem("2048,4096,1024", "bf16", "nt")) == pytest.approx(3.0)
    assert FAMILY.distance(one, _problem("1024,4096,4096", "fp16", "nt")) == math.inf
    assert FAMILY.distance(one, _problem("1024,4096,4096", "bf16", "nn")) == math.inf
    assert FAMILY.distance(one, _problem("1024,4096,4096", "bf16", "nt", "bias")) == math.inf


def test_suite_problems_parse_and_cover_square_projection_and_skinny_shapes():
    problems = [FAMILY.parse_problem(shape, dtype, flags) for shape, dtype, flags in FAMILY.suite]
    assert len(set(problems)) == len(problems) > 20
    shapes = [p.shape for p in problems]
    assert any(m == n == k == 8192 for m, n, k in shapes) and any(m == n == k == 1024 for m, n, k in shapes)
    assert any(m <= 64 for m, _, _ in shapes) and any(14336 in (n, k) for _, n, k in shapes)
    assert {p.flag("layout") for p in problems} >= {"nn", "nt"} and {p.dtype for p in problems} == {"fp16", "bf16"}


# -- the space ----------------------------------------------------------------------------------
def test_the_default_config_is_the_engineers_first_tile():
    assert FAMILY.default_params() == dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, NUM_WARPS=8, STAGES=3,
                                           SMEM_LAYOUT="swizzle", GROUP_M=8, MMA="sync", PRODUCER_REGS=0,
                                           PERSISTENT=0, SPLIT_K=1, CLUSTER_M=1, C_STORE="direct", SWAP_AB=0,
                                           PINGPONG=0)
    assert FAMILY.check(FAMILY.default_params(), _problem("4096,4096,4096"), H100_LIMITS) is None


# The problems whose whole product is checked config by config (whole_space.py: one pass a problem,
# shared by the tests below): by default a large one; the soak tier (``pytest -m soak``) checks
# three more.
WHOLE = [pytest.param(p, id=p.key) for p in (_problem("4096,4096,4096", "bf16", "tt", "bias_gelu"),)] + [
    pytest.param(p, id=p.key, marks=pytest.mark.soak)
    for p in (_problem("17,1000,33"), _problem("4096,4096,4096", "bf16", "tn"), _problem("1,17,1000"))
]


def _assert_renders(config, problem) -> None:
    source = FAMILY.render(config, problem)
    assert "extern \"C\" __global__" in source and "{{" not in source and "/*%" not in source
    assert f"#define BLOCK_M {config['BLOCK_M']}" in source and f"#define GROUP_M {config['GROUP_M']}" in source
    assert ("bf16.bf16" in source) == (problem.dtype == "bf16")


@pytest.mark.parametrize("problem", WHOLE)
def test_every_config_renders_or_is_rejected_with_a_reason(problem):
    checked = whole_product("gemm", problem)
    assert set(checked.summary.reasons) <= REASONS, checked.summary.reasons
    for config in checked.valid:
        _assert_renders(config, problem)
    assert len(checked.valid) > (500 if problem.shape[0] > 1000 else 30)


@pytest.mark.parametrize("problem", [p.values[0] for p in WHOLE], ids=lambda p: p.key)
def test_every_valid_config_of_every_problem_renders(problem):
    """Each problem's valid configs, as the family enumerates them (the whole product's, where
    test_valid_configs_are_those_of_the_whole_product checks it), render."""
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    for config in valid:
        _assert_renders(config, problem)
    assert len(valid) > (500 if problem.shape[0] > 1000 else 30)


def test_constraints_reject_what_cannot_fit_with_reasons():
    problem = _problem("4096,4096,4096")
    big = dict(FAMILY.default_params(), BLOCK_M=256, BLOCK_N=256)
    assert FAMILY.check(big, problem, H100_LIMITS).startswith("registers")
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCK_M=256, NUM_WARPS=4), problem,
                        H100_LIMITS).startswith("registers")
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCK_M=64, BLOCK_N=64, NUM_WARPS=4), problem, H100_LIMITS) is None
    small_gpu = DeviceLimits("tiny", (9, 0), 1, max_smem_per_block_optin=48 * 1024)
    deep = dict(FAMILY.default_params(), BLOCK_K=64, STAGES=4)
    assert space.smem_bytes(deep, "nn") == 4 * 2 * (128 * 64 + 64 * 128)
    assert FAMILY.check(deep, problem, H100_LIMITS) is None
    assert FAMILY.check(deep, problem, small_gpu).startswith("shared memory")
    wide = dict(FAMILY.default_params(), BLOCK_N=256, BLOCK_K=64)  # 160 fragment registers, 12 loads a stage
    assert FAMILY.check(wide, problem, H100_LIMITS) is None
    assert FAMILY.check(wide, _problem("4096,4096,4097"), H100_LIMITS).startswith("registers")  # rows unaligned
    skinny = _problem("16,4096,4096")
    assert FAMILY.check(FAMILY.default_params(), skinny, H100_LIMITS) == \
        "tile: BLOCK_M=128 is wider than the problem needs (64)"
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCK_M=64), skinny, H100_LIMITS) is None
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCK_K=64), _problem("64,64,20"), H100_LIMITS).startswith("tile")
    with pytest.raises(TemplateError, match="BLOCK_K=48"):
        FAMILY.render(dict(FAMILY.default_params(), BLOCK_K=48), problem)


@pytest.mark.parametrize("problem", WHOLE)
def test_valid_configs_are_those_of_the_whole_product(problem):
    key = lambda c: tuple(sorted(c.items()))  # noqa: E731
    fast = FAMILY.valid_configs(problem, H100_LIMITS)
    everything = whole_product("gemm", problem).valid  # KernelFamily.valid_configs's list
    assert {key(c) for c in fast} == {key(c) for c in everything}
    assert len(fast) == len({key(c) for c in fast}) > 0


def test_no_two_valid_configs_render_the_same_kernel():
    problem = _problem("4096,4096,4096", "fp16", "nt", "bias")
    bodies = {}
    for config in FAMILY.valid_configs(problem, H100_LIMITS):
        body = FAMILY.render(config, problem).split("\n", 2)[2]  # without the comment naming the config
        assert body not in bodies, (config, bodies.get(body))
        bodies[body] = config


def test_starting_points_are_valid_and_lead_with_the_wgmma_path():
    for shape, dtype, flags in FAMILY.suite:
        problem = FAMILY.parse_problem(shape, dtype, flags)
        points = FAMILY.starting_points(problem, H100_LIMITS)
        assert points and all(FAMILY.check(p, problem, H100_LIMITS) is None for p in points)
        assert len({tuple(sorted(p.items())) for p in points}) == len(points)
        assert points[0]["MMA"] == "wgmma" and any(p["MMA"] == "sync" for p in points)
        if min(problem.shape) >= 128 and problem.shape[0] > 256:  # two consumer warpgroups (H200, 2026-11-23)
            assert (points[0]["BLOCK_M"], points[0]["NUM_WARPS"]) == (128, 8) and points[0]["BLOCK_N"] in (192, 256)
            assert points[0]["C_STORE"] == "tma"  # C by TMA (H100, 2026-11-26)
            wide = [p for p in points if p["BLOCK_N"] in space.NON_POW2_BLOCK_N]  # H100, 2026-11-27
            if space.units(starts.TMA_C_POINTS[1], problem) > H100_LIMITS.sm_count:  # persistent: more tiles than SMs
                assert wide and points.index(wide[0]) <= 1
            assert FAMILY.default_params() in points
        swapped = [p for p in points if p["SWAP_AB"]]
        if problem.shape[0] <= 256 and problem.flag("layout")[0] == "n":  # small M (H100, 2026-11-27)
            assert swapped and points[:len(swapped)] == swapped  # A's rows as the MMA's N first
            assert all(p["BLOCK_M"] <= max(16, problem.shape[0]) for p in swapped)
        else:
            assert not swapped
        if problem.shape[0] <= 64 and problem.shape[1] % 8 == 0:  # then C by TMA (H100, 2026-11-27)
            after = points[len(swapped):len(swapped) + len(starts.SMALL_M_TMA_C_POINTS)]
            assert [(p["BLOCK_M"], p["C_STORE"]) for p in after] == [(64, "tma")] * len(starts.SMALL_M_TMA_C_POINTS)
    older = DeviceLimits("sm80", (8, 0), 108, max_smem_per_block_optin=163 * 1024)
    assert all(p["MMA"] == "sync" for p in FAMILY.starting_points(_problem("4096,4096,4096"), older))
    unaligned = FAMILY.starting_points(_problem("4096,4096,4097"), H100_LIMITS)  # K odd: rows unaligned
    assert unaligned and all(p["MMA"] == "sync" for p in unaligned)


def test_c_by_tma_stages_boxes_in_shared_memory_and_needs_16_byte_rows_of_c():
    params = dict(FAMILY.default_params(), **starts.TMA_C_POINTS[0])
    problem = _problem("4096,4096,4096", "bf16", "nt")
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    launch = FAMILY.launch(params, problem)
    maps = [a.value for a in launch.args if a.kind == "tensormap"]
    assert [m.buffer for m in maps] == ["a", "b", "c"]  # C's map in place of its pointer
    assert "c" not in [a.value for a in launch.args if a.kind == "buffer"]
    assert maps[2].dims == (4096, 4096) and maps[2].box == (64, 64) and maps[2].swizzle == 128
    direct = dict(params, C_STORE="direct")
    assert launch.smem_bytes - FAMILY.launch(direct, problem).smem_bytes == 2 * 2 * 64 * 64 * 2  # two boxes a warpgroup
    source = FAMILY.render(params, problem)
    assert "#define C_TMA 1" in source and "const __grid_constant__ TmaMap tm_c" in source
    assert "#define C_TMA 0" in FAMILY.render(direct, problem)
    odd_n = _problem("4096,4100,4096", "bf16", "nt")
    assert FAMILY.check(params, odd_n, H100_LIMITS).startswith("tma: C's rows")
    assert FAMILY.check(direct, odd_n, H100_LIMITS) is None
    assert all(p["C_STORE"] == "direct" for p in FAMILY.starting_points(odd_n, H100_LIMITS))
    assert FAMILY.check(dict(FAMILY.default_params(), C_STORE="tma"), problem, H100_LIMITS).startswith("path:")


# -- source and launch --------------------------------------------------------------------------
def test_the_source_follows_layout_epilogue_and_alignment():
    params = FAMILY.default_params()
    source = FAMILY.render(params, _problem("4096,4096,4096", "fp16", "tn", "bias_relu"))
    for line in ("#define A_TRANS 1", "#define B_TRANS 0", "#define A_ALIGNED 1", "#define B_ALIGNED 1",
                 "#define C_EVEN 1", "#define BIAS 1", "#define ACTIVATION 1", "#define WARPS_M 2",
                 "#define WARP_M 64", "#define WARP_N 32"):
        assert line + "\n" in source or line + " " in source, line
    odd = FAMILY.render(params, _problem("1001,999,4097", "bf16", "nt", "bias_gelu"))
    for line in ("#define A_TRANS 0", "#define B_TRANS 1", "#define A_ALIGNED 0", "#define B_ALIGNED 0",
                 "#define C_EVEN 0", "#define ACTIVATION 2"):
        assert line + "\n" in odd or line + " " in odd, line
    assert "const elem_t* __restrict__ bias" in odd
    tanh = FAMILY.render(params, _problem("1001,999,4097", "bf16", "nt", "bias_gelu_tanh"))
    assert "#define ACTIVATION 3 " in tanh and "x0 = gelu_tanh(x0);" in tanh
    assert "bias" not in FAMILY.render(params, _problem("64,64,64")).split("gemm(", 1)[1].split(")")[0]
    # M, N and K are arguments: problems alike in dtype, flags and alignment share the source
    assert FAMILY.render(params, _problem("1024,1024,1024")) == FAMILY.render(params, _problem("8,4096,40"))
    assert FAMILY.render(params, _problem("1024,1024,1024")) != FAMILY.render(params, _problem("8,4096,41"))


def test_launch_geometry_covers_every_tile():
    problem = _problem("1000,17,4097", "bf16", "tt", "bias")
    params = dict(FAMILY.default_params(), BLOCK_M=64, BLOCK_N=64, NUM_WARPS=4)
    launch = FAMILY.launch(params, problem)
    assert launch.kernel == "gemm" and launch.grid == (math.ceil(1000 / 64) * 1, 1, 1)
    assert launch.block == (128, 1, 1) and launch.smem_bytes == space.smem_bytes(params, "tt")
    assert [(a.kind, a.value) for a in launch.args] == [("buffer", "a"), ("buffer", "b"), ("buffer", "bias"),
                                                        ("buffer", "c"), ("i32", 1000), ("i32", 17), ("i32", 4097)]
    plain = FAMILY.launch(FAMILY.default_params(), _problem("4096,4096,4096"))
    assert plain.grid == (32 * 32, 1, 1) and [a.value for a in plain.args[:3]] == ["a", "b", "c"]


def test_template_hash_is_stable():
    assert FAMILY.template_hash == get_family("gemm").template_hash and len(FAMILY.template_hash) == 16


# -- the reference ------------------------------------------------------------------------------
def _exact_output(problem, inputs):
    """C in float64 over every row, rounded to the element type: a correct kernel's output."""
    rows = np.arange(problem.shape[0])
    return gemm.to_bits(gemm.reference_rows(problem, inputs, rows).astype(np.float32), problem.dtype)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout, epilogue", [("nn", "none"), ("nt", "bias"), ("tn", "bias_relu"),
                                              ("tt", "bias_gelu"), ("nt", "bias_gelu_tanh")])
def test_validate_accepts_a_correct_output_and_rejects_broken_ones(dtype, layout, epilogue):
    problem = _problem("77,45,301", dtype, layout, epilogue)
    inputs = FAMILY.inputs(problem, seed=3)
    assert inputs["a"].shape == ((301, 77) if layout[0] == "t" else (77, 301))
    assert inputs["b"].shape == ((45, 301) if layout[1] == "t" else (301, 45))
    assert ("bias" in inputs) == (epilogue != "none")
    assert all(np.count_nonzero(x) > 0.99 * x.size for x in inputs.values())
    good = _exact_output(problem, inputs)
    # the same product computed from the stored layouts another way: numpy's float32 matmul
    a = gemm.from_bits(inputs["a"], dtype).astype(np.float32)
    b = gemm.from_bits(inputs["b"], dtype).astype(np.float32)
    product = (a.T if layout[0] == "t" else a) @ (b.T if layout[1] == "t" else b)
    bias = gemm.from_bits(inputs["bias"], dtype) if epilogue != "none" else None
    other = gemm.to_bits(gemm.epilogue(product.astype(np.float64), bias, epilogue).astype(np.float32), dtype)
    for output in (good, other):
        result = FAMILY.validate(problem, inputs, {"c": output})
        assert result.ok and result.error < gemm.tolerance(problem) / 2, result
    kept = FAMILY.reference(problem, inputs)  # what a worker computes once per problem
    assert FAMILY.validate(problem, inputs, {"c": good}, kept) == FAMILY.validate(problem, inputs, {"c": good})

    unwritten = good.copy()
    unwritten[76, 44] = gemm.POISON[dtype]
    result = check_outputs(FAMILY, problem, inputs, {"c": unwritten})
    assert not result.ok and result.reason == "1 element of 'c' is NaN/Inf or unwritten"
    assert check_outputs(FAMILY, problem, inputs, {"c": good}).ok

    wrong = gemm.to_bits(gemm.from_bits(good, dtype).astype(np.float32) * 1.02, dtype)
    result = FAMILY.validate(problem, inputs, {"c": wrong})
    assert not result.ok and "relative error" in result.reason
    # one K step of 16 left out: caught
    short = dict(inputs)
    cut = inputs["a"].copy()
    cut[:16] = 0 if layout[0] == "t" else cut[:16]
    if layout[0] == "n":
        cut[:, :16] = 0
    short["a"] = cut
    assert not FAMILY.validate(problem, inputs, {"c": _exact_output(problem, short)}).ok
    if epilogue != "none":  # the output of another epilogue fails
        plain = _problem("77,45,301", dtype, layout, "none")
        assert not FAMILY.validate(problem, inputs, {"c": _exact_output(plain, inputs)}).ok


def test_the_tolerance_grows_with_sqrt_k_past_the_reference_depth():
    assert gemm.tolerance(_problem("64,64,64")) == gemm.tolerance(_problem("64,64,4096")) == gemm.TOLERANCE["fp16"]
    assert gemm.tolerance(_problem("64,64,16384", "bf16")) == pytest.approx(2 * gemm.TOLERANCE["bf16"])


def test_checked_rows_hold_the_first_and_last_and_random_rows():
    rows = gemm.checked_rows(4097, np.random.default_rng(0))
    assert {0, 7, 4089, 4096} <= set(rows.tolist()) and len(rows) > 16 and rows.max() < 4097
    assert gemm.checked_rows(3, np.random.default_rng(0)).tolist() == [0, 1, 2]


def test_inputs_are_seeded_and_the_bias_is_the_size_of_c():
    problem = _problem("300,200,400", "bf16", "nt", "bias")
    one, again, other = FAMILY.inputs(problem, 7), FAMILY.inputs(problem, 7), FAMILY.inputs(problem, 8)
    assert all(np.array_equal(one[n], again[n]) for n in one)
    assert not np.array_equal(one["a"], other["a"])
    bias = gemm.from_bits(one["bias"], "bf16")
    assert 0.7 * math.sqrt(400) < bias.std() < 1.3 * math.sqrt(400)


def test_gelu_is_the_erf_form():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    expected = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    assert gemm.epilogue(x, np.zeros(5), "bias_gelu") == pytest.approx(expected)
    assert gemm.epilogue(x, np.ones(5), "bias_relu").tolist() == [0.0, 0.0, 1.0, 1.5, 3.0]


def test_gelu_tanh_is_the_tanh_approximation_after_the_bias():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    u = [math.sqrt(2 / math.pi) * (v + 0.044715 * v**3) for v in x + 1]
    expected = [0.5 * v * (1 + math.tanh(w)) for v, w in zip(x + 1, u)]
    assert gemm.epilogue(x, np.ones(5), "bias_gelu_tanh") == pytest.approx(expected, rel=1e-15)
    erf = gemm.epilogue(x, np.zeros(5), "bias_gelu")
    assert gemm.epilogue(x, np.zeros(5), "bias_gelu_tanh") != pytest.approx(erf, rel=1e-6)


def test_gelu_tanh_is_torchs_in_float64():
    """The reference is F.gelu(approximate="tanh") (what cuBLASLt's fused GELU computes) to
    float64's rounding, over the range a biased C spans and past it (absolutely where both round
    1 + tanh(u) near -1: apart by 4e-16 there)."""
    torch = pytest.importorskip("torch")
    F = pytest.importorskip("torch.nn.functional")
    x = np.concatenate([np.linspace(-20.0, 20.0, 4001), [-1e3, -60.0, -1e-8, 0.0, 1e-8, 60.0, 1e3],
                        np.random.default_rng(0).normal(0.0, 64.0, 2000)])
    bias = np.random.default_rng(1).normal(0.0, 1.0, x.size)
    ours = gemm.epilogue(x, bias, "bias_gelu_tanh")
    theirs = F.gelu(torch.from_numpy(x + bias), approximate="tanh").numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-14)
    erf = F.gelu(torch.from_numpy(x + bias)).numpy()
    assert np.abs(ours - erf).max() > 1e-4  # the other form: apart by more than float64's rounding


def test_the_kernels_gelu_tanh_in_float32_is_within_fp16s_rounding():
    """kernel.cu.j2's and hopper.cu.j2's gelu_tanh, x / (1 + e^(-2u)) in float32, emulated: within
    1e-5 of the float64 tanh form relative where the result is above 1e-6, and 1e-6 apart below
    (fp16 rounds C to 5e-4 relative; float64's 1 + tanh(u) itself cancels past u = -8), and finite
    where e^(-2u) overflows."""
    x = np.concatenate([np.linspace(-30.0, 30.0, 6001), [-1e4, -100.0, 100.0, 1e4]]).astype(np.float32)
    with np.errstate(over="ignore"):
        e = np.exp(-x * (np.float32(1.5957691216057308) + np.float32(0.0713548162726003) * x * x))
        got = (x / (np.float32(1.0) + e)).astype(np.float64)
    expected = gemm.gelu_tanh(x)
    assert np.isfinite(got).all()
    large = np.abs(expected) > 1e-6
    assert np.max(np.abs(got - expected)[large] / np.abs(expected[large])) < 1e-5
    assert np.max(np.abs(got - expected)[~large]) < 1e-6


# -- the peers without a GPU ----------------------------------------------------------------------
def test_importing_the_triton_peer_imports_neither_torch_nor_triton():
    code = ("import sys; import templates.gemm.triton_peer as p; import templates.gemm.peers; "
            "print('torch' in sys.modules, 'triton' in sys.modules, p.triton, p.tl)")
    shown = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["False", "False", "None", "None"]


def test_the_triton_peer_space_is_the_tutorials():
    from templates.gemm import triton_peer

    assert len(set(triton_peer.CONFIG_SPACE)) == len(triton_peer.CONFIG_SPACE) >= 8
    assert (128, 256, 64, 3, 8) in triton_peer.CONFIG_SPACE and triton_peer.EPILOGUES == gemm.EPILOGUES


# -- compiling for sm_90a (CPU only) -------------------------------------------------------------
# The wgmma path's heaviest epilogue: 128 x 256, two consumer warpgroups, persistent, C by TMA.
HEAVY_WGMMA = dict(FAMILY.default_params(), MMA="wgmma", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_WARPS=8, STAGES=4,
                   PRODUCER_REGS=40, PERSISTENT=1, C_STORE="tma")
# Ping-pong's: a whole 128 x 128 tile a warpgroup, in clusters of two, C by TMA.
HEAVY_PINGPONG = dict(HEAVY_WGMMA, BLOCK_N=128, STAGES=6, CLUSTER_M=2, PINGPONG=1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_sample_of_configs_compiles_for_sm90a_without_spilling(tmp_path):
    """Every layout and epilogue, aligned and not, and the configs nearest the register budget."""
    from workers.results import CompileRequest

    rng = random.Random(15)
    jobs = []
    for layout, epilogue, dtype, shape in (("nn", "none", "fp16", "4096,4096,4096"), ("nt", "bias", "bf16", "1000,17,4097"),
                                           ("tn", "bias_relu", "fp16", "4097,1001,1000"),
                                           ("tt", "bias_gelu", "bf16", "4096,4096,4096"),
                                           ("nn", "bias_gelu_tanh", "fp16", "1000,1001,999")):
        problem = _problem(shape, dtype, layout, epilogue)
        valid = FAMILY.valid_configs(problem, H100_LIMITS)
        heaviest = max(valid, key=lambda c: (space.fragment_registers(c), c["BLOCK_K"], c["STAGES"]))
        jobs += [(problem, params) for params in rng.sample(valid, 3) + [heaviest]]
    jobs.append((_problem("4096,4096,4096", "bf16", "nn", "bias_gelu"),
                 dict(FAMILY.default_params(), BLOCK_M=256, BLOCK_K=64, STAGES=4, SMEM_LAYOUT="pad8")))
    jobs.append((_problem("4096,4096,4096", "bf16", "nt", "bias_gelu_tanh"), HEAVY_WGMMA))
    jobs.append((_problem("4096,4096,4096", "fp16", "tn", "bias_gelu"), HEAVY_PINGPONG))
    for problem, params in jobs:
        assert FAMILY.check(params, problem, H100_LIMITS) is None
    requests = [CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
                for problem, params in jobs]
    for (problem, params), binary in zip(jobs, cores.compile_each(requests, tmp_path)):
        assert binary.cubin[:4] == b"\x7fELF"
        resources = binary.resources
        assert resources is not None and 32 <= resources.registers <= 255, params
        assert resources.spill_stores == 0 and resources.stack_bytes == 0, (problem.key, params, resources)


def test_render_module_names_its_kernel():
    assert render.KERNEL_NAME == FAMILY.launch(FAMILY.default_params(), _problem()).kernel


# -- through the tuner ----------------------------------------------------------------------------
def test_the_command_line_reads_gemms_flags_and_refuses_bad_ones(tmp_path, capsys):
    from storage import open_repository
    from tuner.cli.commands import main

    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    open_repository(db).close()  # an empty database, not a missing one
    with pytest.raises(SystemExit) as exit_:  # argparse offers the flag's choices
        main(["best", "gemm", "--shape", "4096,4096,4096", "--dtype", "bf16", "--layout", "tx", "--db", db])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "tuner: error: argument --layout: invalid choice: 'tx' (choose from 'nn', 'nt', 'tn', 'tt')"
    # a valid problem that was never tuned: nothing stored, said in one line
    code = main(["best", "gemm", "--shape", "4096,4096,4096", "--dtype", "bf16", "--layout", "nt", "--epilogue",
                 "bias_gelu", "--db", db])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "4096x4096x4096-bf16-epilogue=bias_gelu-layout=nt" in err[0], err
    code = main(["best", "gemm", "--shape", "64,64,64", "--dtype", "fp16", "--epilogue", "bias_gelu_tanh",
                 "--db", db])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "64x64x64-fp16-epilogue=bias_gelu_tanh-layout=nn" in err[0], err


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be visible here")
def test_tune_without_a_gpu_says_so_in_one_line(tmp_path):
    """The real path: the family and its flags are read, the space is built, workers find no GPU."""
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TUNER_DB", None)
    done = subprocess.run([sys.executable, "-m", "tuner", "tune", "gemm", "--shape", "1000,17,4097", "--dtype", "fp16",
                           "--layout", "tt", "--epilogue", "bias_relu", "--db", f"sqlite:///{tmp_path / 't.db'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "tuner: error: no GPU is visible (to tune without one, replay a recorded landscape with --replay FILE)"]


# -- the kernel's shared-memory addressing, emulated ----------------------------------------------
def _tile_off(row, col, cols, stride, swizzle):
    """kernel.cu.j2's tile_off<COLS, STRIDE>."""
    if not swizzle:
        return row * stride + col
    chunks = cols // 8
    per_line, span = (1, 8) if chunks >= 8 else (8 // chunks, chunks)
    return row * stride + ((((col >> 3) ^ ((row // per_line) % span)) << 3) | (col & 7))


def _ldmatrix_x4(smem, addresses, trans):
    """Registers (4 per lane, each two elements low first) of ldmatrix.x4 from element offsets."""
    mats = [np.stack([smem[a:a + 8] for a in addresses[8 * i:8 * i + 8]]) for i in range(4)]
    return [[(m[2 * (lane % 4), lane // 4], m[2 * (lane % 4) + 1, lane // 4]) if trans else
             (m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1]) for m in mats] for lane in range(32)]


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("smem_layout", ["swizzle", "pad8"])
@pytest.mark.parametrize("block_k", [32, 64])
def test_fragments_read_from_shared_memory_are_the_tiles_of_a_and_b(layout, smem_layout, block_k):
    """The kernel's stores into shared memory and its ldmatrix addresses (ported), emulated: every
    mma fragment holds the elements m16n8k16 expects, and each 8-row read of the swizzled layout
    touches 8 different 16-byte bank groups."""
    params = dict(FAMILY.default_params(), BLOCK_M=128, BLOCK_N=64, BLOCK_K=block_k, SMEM_LAYOUT=smem_layout)
    (a_rows, a_cols), (b_rows, b_cols) = space.operand_tiles(params, layout)
    rng = np.random.default_rng(0)
    a = rng.integers(1, 60000, size=(128, block_k))  # logical A tile (m, k) and B tile (k, n)
    b = rng.integers(1, 60000, size=(block_k, 64))
    smem_a = np.zeros(a_rows * space.row_stride(params, a_cols), dtype=np.int64)
    smem_b = np.zeros(b_rows * space.row_stride(params, b_cols), dtype=np.int64)
    swz = smem_layout == "swizzle"
    for r in range(a_rows):  # stored as in global memory: A^T for "t", B^T for "t"
        for c in range(a_cols):
            smem_a[_tile_off(r, c, a_cols, space.row_stride(params, a_cols), swz)] = a[c, r] if layout[0] == "t" else a[r, c]
    for r in range(b_rows):
        for c in range(b_cols):
            smem_b[_tile_off(r, c, b_cols, space.row_stride(params, b_cols), swz)] = b[c, r] if layout[1] == "t" else b[r, c]
    off_a = lambda r, c: _tile_off(r, c, a_cols, space.row_stride(params, a_cols), swz)  # noqa: E731
    off_b = lambda r, c: _tile_off(r, c, b_cols, space.row_stride(params, b_cols), swz)  # noqa: E731
    lanes = range(32)
    for ks in range(block_k // 16):
        for m in (0, 48, 112):
            if layout[0] == "t":
                addresses = [off_a(ks * 16 + (l % 8) + 8 * (l // 16), m + 8 * ((l // 8) % 2)) for l in lanes]
            else:
                addresses = [off_a(m + (l % 16), ks * 16 + 8 * (l // 16)) for l in lanes]
            frags = _ldmatrix_x4(smem_a, addresses, layout[0] == "t")
            for lane in lanes:
                g, t = lane // 4, lane % 4
                for reg, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                    assert frags[lane][reg] == (a[m + g + dr, ks * 16 + 2 * t + dk], a[m + g + dr, ks * 16 + 2 * t + dk + 1])
            if swz:
                for phase in range(4):
                    assert len({(x * 2 // 16) % 8 for x in addresses[8 * phase:8 * phase + 8]}) == 8
        for n in (0, 16, 48):
            if layout[1] == "t":
                addresses = [off_b(n + (l % 8) + 8 * (l // 16), ks * 16 + 8 * ((l // 8) % 2)) for l in lanes]
            else:
                addresses = [off_b(ks * 16 + (l % 8) + 8 * ((l // 8) % 2), n + 8 * (l // 16)) for l in lanes]
            frags = _ldmatrix_x4(smem_b, addresses, layout[1] == "n")
            for lane in lanes:
                g, t = lane // 4, lane % 4
                for reg, (dk, dn) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                    k = ks * 16 + 2 * t + dk
                    assert frags[lane][reg] == (b[k, n + g + dn], b[k + 1, n + g + dn]), (lane, reg)
            if swz:
                for phase in range(4):
                    assert len({(x * 2 // 16) % 8 for x in addresses[8 * phase:8 * phase + 8]}) == 8


# -- split-K, persistent blocks, clusters (the wgmma path) --------------------------------------
def _wgmma(**extra):
    return {**FAMILY.default_params(), "MMA": "wgmma", "BLOCK_K": 64, "BLOCK_M": 64, "BLOCK_N": 128, "NUM_WARPS": 4,
            "STAGES": 4, **extra}


def test_split_k_is_for_problems_whose_tiles_leave_multiprocessors_idle():
    skinny = _problem("64,4096,14336", "bf16", "nt")
    assert FAMILY.check(_wgmma(SPLIT_K=4), skinny, H100_LIMITS) is None  # 32 tiles, 128 units
    square = _problem("4096,4096,4096")
    assert FAMILY.check(_wgmma(SPLIT_K=2), square, H100_LIMITS).startswith("split-K: 4096 work units")
    assert FAMILY.check(_wgmma(BLOCK_N=256, SPLIT_K=2, NUM_WARPS=8, BLOCK_M=128, PRODUCER_REGS=40),
                        _problem("1152,4096,4096"), H100_LIMITS) == "split-K: 144 tiles already fill 132 multiprocessors"
    assert FAMILY.check(_wgmma(SPLIT_K=8), _problem("64,4096,256"), H100_LIMITS) == "split-K: 8 parts of 4 k tiles"
    # 128 accumulators a thread beside the sum: only with setmaxnreg's registers
    wide = _wgmma(BLOCK_N=256, SPLIT_K=2)
    assert FAMILY.check(wide, skinny, H100_LIMITS).startswith("registers: split-K's sum")
    assert FAMILY.check(dict(wide, PRODUCER_REGS=40), skinny, H100_LIMITS) is None


def test_a_split_k_launch_carries_its_workspace_and_a_block_a_unit():
    problem = _problem("64,4096,14336", "bf16", "nt")
    params = _wgmma(SPLIT_K=4)
    launch = FAMILY.launch(params, problem)
    assert launch.grid == (32 * 4, 1, 1) and launch.blocks_per_sm_cap == 0
    assert dict(launch.workspace) == {"partials": space.MAX_SPLIT_UNITS * 64 * 128 * 4,
                                      "counters": space.MAX_SPLIT_UNITS * 4}
    names = [a.value for a in launch.args if a.kind == "buffer"]
    assert names == ["c", "partials", "counters"]
    source = FAMILY.render(params, problem)
    assert "#define SPLIT_K 4" in source and "float* __restrict__ partials" in source
    # two blocks an SM: one consumer warpgroup of 64 accumulators, no setmaxnreg, both fit
    assert space.blocks_per_sm(params, "nt") == 2 and "#define BLOCKS_PER_SM 2" in source
    assert space.blocks_per_sm(dict(params, PRODUCER_REGS=40), "nt") == 1
    assert space.blocks_per_sm(_wgmma(BLOCK_M=128, NUM_WARPS=8), "nt") == 1  # two consumer warpgroups
    plain = FAMILY.launch(_wgmma(), problem)
    assert plain.workspace == () and [a.value for a in plain.args if a.kind == "buffer"] == ["c"]


def test_persistent_blocks_are_capped_at_what_the_multiprocessors_hold():
    problem = _problem("4096,4096,4096")
    params = _wgmma(BLOCK_M=128, BLOCK_N=256, NUM_WARPS=8, PRODUCER_REGS=40, PERSISTENT=1)
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    launch = FAMILY.launch(params, problem)
    assert launch.grid == (32 * 16, 1, 1) and launch.blocks_per_sm_cap == 1
    assert launch.grid_on(132) == (132, 1, 1)
    assert FAMILY.check(params, _problem("1024,1024,4096"), H100_LIMITS).startswith("persistent: 32 work units")
    # a producer that loops over units needs more than 24 registers
    assert FAMILY.check(dict(params, PRODUCER_REGS=24), problem, H100_LIMITS).startswith("registers: a producer")


def test_more_than_96_accumulators_a_thread_take_setmaxnreg_and_tma_stores_load_the_bias_ahead_where_registers_allow():
    problem = _problem("8192,3072,768", "bf16", "nt", "bias")
    wide = _wgmma(BLOCK_M=128, BLOCK_N=256, NUM_WARPS=8, PRODUCER_REGS=40, PERSISTENT=1)
    for store in ("direct", "tma"):
        assert FAMILY.check(dict(wide, C_STORE=store), problem, H100_LIMITS) is None
        assert FAMILY.check(dict(wide, C_STORE=store, PRODUCER_REGS=0), problem, H100_LIMITS).startswith(
            "registers: 128 accumulators a thread spill in 168 registers")
    # C by TMA, 128 accumulators beside 232 registers: the whole tile's bias ahead of the first box;
    # 96 beside the cap's 168 not; from registers never
    wide = dict(wide, C_STORE="tma")
    assert "#define BIAS_AHEAD 1" in FAMILY.render(wide, problem)
    capped = dict(wide, BLOCK_N=192, PRODUCER_REGS=0)
    assert FAMILY.check(capped, problem, H100_LIMITS) is None
    assert "#define BIAS_AHEAD 0" in FAMILY.render(capped, problem)
    assert "#define BIAS_AHEAD 0" in FAMILY.render(dict(wide, C_STORE="direct"), problem)
    assert "#define BIAS_AHEAD 0" in FAMILY.render(wide, _problem("8192,3072,768", "bf16", "nt", "none"))
    # A on the MMA's N side (few rows): its own registers' rules
    swapped = _wgmma(BLOCK_M=32, BLOCK_N=256, NUM_WARPS=8, PRODUCER_REGS=0, SWAP_AB=1)
    assert not space.plain_accumulators_spill(swapped) and not space.bias_ahead(swapped)


def test_pingpong_warpgroups_take_whole_tiles_in_turn():
    params = _wgmma(BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, PRODUCER_REGS=40, PERSISTENT=1, C_STORE="tma", PINGPONG=1)
    problem = _problem("8192,3072,768", "fp16", "nt", "bias_gelu_tanh")
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    shared = dict(params, PINGPONG=0)  # the same tile, each warpgroup computing half its rows
    assert (space.warpgroup_rows(params), space.accumulators(params)) == (128, 128)
    assert (space.warpgroup_rows(shared), space.accumulators(shared)) == (64, 64)
    launch = FAMILY.launch(params, problem)
    assert launch.grid == (64 * 24, 1, 1) and launch.blocks_per_sm_cap == 1 and launch.grid_on(132) == (132, 1, 1)
    source = FAMILY.render(params, problem)
    assert "#define PINGPONG 1" in source and "#define PERSISTENT 1" in source and "m64n128k16" in source
    assert "#define PINGPONG 0" in FAMILY.render(shared, problem)
    refused = {
        "one consumer warpgroup": (dict(params, NUM_WARPS=4, BLOCK_M=64), problem, "pingpong: PINGPONG=1"),
        "K in parts": (dict(params, SPLIT_K=2), problem, "pingpong: PINGPONG=1"),
        "a block a tile": (dict(params, PERSISTENT=0), problem, "pingpong: PINGPONG=1"),
        "256 rows a warpgroup": (dict(params, BLOCK_M=256, BLOCK_N=64), problem,
                                 "wgmma: 256 rows a consumer warpgroup"),
        "no setmaxnreg": (dict(params, PRODUCER_REGS=0), problem, "registers: 128 accumulators a thread spill"),
        "too few tiles": (params, _problem("1024,1024,4096", "fp16", "nt"), "persistent: 64 work units"),
        "mma.sync": (dict(FAMILY.default_params(), PINGPONG=1), problem, "path: PINGPONG applies"),
    }
    for what, (config, where, reason) in refused.items():
        assert FAMILY.check(config, where, H100_LIMITS).startswith(reason), what
    assert FAMILY.check(dict(params, BLOCK_M=64, BLOCK_N=192, PRODUCER_REGS=0), problem, H100_LIMITS) is None  # 96
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    assert any(space.pingpong(c) for c in valid) and all(
        c["NUM_WARPS"] == 8 and c["SPLIT_K"] == 1 for c in valid if space.pingpong(c))


def test_a_cluster_pairs_tile_rows_and_halves_bs_box():
    params = _wgmma(BLOCK_M=128, BLOCK_N=256, NUM_WARPS=8, PRODUCER_REGS=40, CLUSTER_M=2)
    odd = _problem("4104,1000,520", "fp16", "nt")  # 33 tile rows: rounded up to 34, a pair each
    assert FAMILY.check(params, odd, H100_LIMITS) is None
    assert space.tiles(params, odd) == 34 * 4 and FAMILY.launch(params, odd).grid == (136, 1, 1)
    maps = {a.value.buffer: a.value for a in FAMILY.launch(params, odd).args if a.kind == "tensormap"}
    assert maps["a"].box == (64, 128) and maps["b"].box == (64, 128)  # half of B's 256 rows a block
    nn = _problem("4104,1000,520", "fp16", "nn")
    assert {a.value.box for a in FAMILY.launch(params, nn).args if a.kind == "tensormap"} == {(64, 128), (64, 64)}
    source = FAMILY.render(params, odd)
    assert "__cluster_dims__(CLUSTER_M, 1, 1)" in source and "multicast::cluster" in source
    assert "__cluster_dims__" not in FAMILY.render(dict(params, CLUSTER_M=1), odd).split("#define")[-1]
    assert FAMILY.check(params, _problem("128,4096,4096"), H100_LIMITS).startswith("cluster: M=128")
    assert FAMILY.check(dict(params, BLOCK_N=64), nn, H100_LIMITS).startswith("cluster: B's N-major")


def test_swap_ab_puts_as_rows_on_the_mmas_n_for_small_m_only():
    params = _wgmma(BLOCK_M=16, BLOCK_N=64, STAGES=12, SWAP_AB=1)
    skinny = _problem("16,4096,4096", "bf16", "nt")
    assert FAMILY.check(params, skinny, H100_LIMITS) is None
    assert space.mma_tile(params) == (64, 16) and space.accumulators(params) == 8
    assert FAMILY.launch(params, skinny).grid == (64, 1, 1)  # 4096 / 64 columns of C, one row of tiles
    maps = {a.value.buffer: a.value for a in FAMILY.launch(params, skinny).args if a.kind == "tensormap"}
    assert maps["a"].box == (64, 16) and maps["b"].box == (64, 64)  # A's 16 rows, B's 64 rows a stage
    source = FAMILY.render(params, skinny)
    # B's K-major tile is the MMA's A, A's K-major tile its B: neither transposed; C^T in 16 columns
    assert "#define SWAP_AB 1" in source and "m64n16k16.f32.bf16.bf16" in source and "p, 1, 1, 0, 0;" in source
    nn = _problem("16,4096,4096", "bf16", "nn")
    assert "p, 1, 1, 1, 0;" in FAMILY.render(params, nn)  # B N-major: the MMA's A is M-major
    unswapped = FAMILY.render(dict(params, BLOCK_M=64, SWAP_AB=0), skinny)
    assert "#define SWAP_AB 0" in unswapped and "m64n64k16" in unswapped
    refused = {
        "BLOCK_M=16 without it": (dict(params, SWAP_AB=0), skinny, "tile: BLOCK_M=16 only with SWAP_AB"),
        "large M": (params, _problem("4096,4096,4096", "bf16", "nt"), "swap: M=4096 > 256"),
        "A transposed": (params, _problem("16,4096,4096", "bf16", "tn"), "swap: A must be row-major"),
        "C by TMA": (dict(params, C_STORE="tma"), skinny, "swap: SWAP_AB stores C from registers"),
        "wider than M": (dict(params, BLOCK_M=32), skinny, "tile: BLOCK_M=32 is wider than the problem needs (16)"),
        "mma.sync": (dict(FAMILY.default_params(), SWAP_AB=1), skinny, "path: SWAP_AB applies to MMA=wgmma only"),
    }
    for what, (config, problem, reason) in refused.items():
        assert FAMILY.check(config, problem, H100_LIMITS).startswith(reason), what
    assert FAMILY.check(dict(params, BLOCK_M=128, BLOCK_N=128, STAGES=6), _problem("128,4096,4096", "bf16", "nt"),
                        H100_LIMITS) is None  # 128 rows of A as the MMA's N: 128 accumulators
    assert space.accumulators(dict(params, BLOCK_M=128, BLOCK_N=128)) == 128


def test_tiles_of_192_and_224_columns_fill_the_last_wave():
    params = _wgmma(BLOCK_M=128, BLOCK_N=224, NUM_WARPS=8, PRODUCER_REGS=40, PERSISTENT=1)
    problem = _problem("1024,14336,4096", "bf16", "nt")
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    assert space.tiles(params, problem) == 8 * 64 and space.tiles(dict(params, BLOCK_N=256), problem) == 8 * 56
    assert space.accumulators(params) == 112
    maps = {a.value.buffer: a.value for a in FAMILY.launch(params, problem).args if a.kind == "tensormap"}
    assert maps["b"].box == (64, 224)  # B K-major: one box of the tile's 224 rows
    assert "m64n224k16" in FAMILY.render(params, problem)
    nn = _problem("1024,14336,4096", "bf16", "nn")
    assert FAMILY.check(params, nn, H100_LIMITS).startswith("tma: BLOCK_N=224 is not whole 64-column boxes")
    assert FAMILY.check(dict(params, C_STORE="tma"), problem, H100_LIMITS).startswith("tma: BLOCK_N=224")
    assert FAMILY.check(dict(params, BLOCK_N=192, C_STORE="tma"), nn, H100_LIMITS) is None  # three 64-column boxes
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCK_N=192), problem, H100_LIMITS).startswith("path:")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_swapped_configs_compile_without_spilling(tmp_path):
    from workers.results import CompileRequest

    jobs = []
    for shape, layout, epilogue, extra in (("1,4096,4096", "nt", "none", dict(BLOCK_M=16, BLOCK_N=64, STAGES=16)),
                                           ("100,1000,4104", "nn", "bias_gelu", dict(BLOCK_M=128, BLOCK_N=128,
                                                                                    STAGES=6, SPLIT_K=2,
                                                                                    PRODUCER_REGS=40)),
                                           ("64,4096,14336", "nt", "bias", dict(BLOCK_M=32, NUM_WARPS=8,
                                                                                BLOCK_N=256, PERSISTENT=1,
                                                                                SPLIT_K=8, PRODUCER_REGS=40))):
        problem = _problem(shape, "bf16", layout, epilogue)
        params = _wgmma(SWAP_AB=1, **extra)
        assert FAMILY.check(params, problem, H100_LIMITS) is None, params
        jobs.append((problem, params))
    requests = [CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
                for problem, params in jobs]
    for (problem, params), binary in zip(jobs, cores.compile_each(requests, tmp_path)):
        resources = binary.resources
        assert resources.spill_stores == 0 and resources.stack_bytes == 0, (problem.key, params, resources)


# -- the landscapes the family ships (every valid config, `--sampler grid`: 16-bit on an H100,
# 2026-11-27; e4m3 per tensor on an H200, 2026-11-29)
@pytest.mark.parametrize("name,shape,dtype,layout,trials", [
    ("gemm_64x4096x14336-bf16-nt_h100", "64,4096,14336", "bf16", "nt", 40),
    ("gemm_2048x2048x2048-fp16-nn_h100", "2048,2048,2048", "fp16", "nn", 40),
    ("gemm_1024x4096x4096-e4m3-nt_h200", "1024,4096,4096", "e4m3", "nt", 40),
])
def test_a_study_replays_a_shipped_landscape_by_name(name, shape, dtype, layout, trials, tmp_path, module_ray):
    import tuner
    from workers.replay import landscape_json

    (path,) = (ROOT / "templates" / "gemm" / "landscapes").glob(f"{name}.json*")  # .json or .json.gz
    landscape = landscape_json(path)
    problem = _problem(shape, dtype, layout)
    assert landscape["family"] == "gemm" and landscape["problem"]["shape"] == list(problem.shape)
    measured = [e for e in landscape["entries"] if e["measurement"]["ok"]]
    # the whole valid space of the recorded template, measured
    assert len(measured) == len(landscape["entries"]) >= 700
    fastest = min(e["measurement"]["timing"]["median_ms"] for e in measured)
    median = sorted(e["measurement"]["timing"]["median_ms"] for e in measured)[len(measured) // 2]
    db = f"sqlite:///{tmp_path / 'replay.db'}"
    # no re-timing: its pick among ties (fewer registers) varies with the replay's trials in flight
    result = tuner.tune("gemm", shape, dtype, {"layout": layout}, trials=trials, replay=name, db=db, seed=0,
                        retime=0)
    assert result.status == "finished" and result.measured == trials and result.failed == 0
    # the starting points and TPE: within 5% of the landscape's best, well under its median
    assert result.best.median_ms <= 1.05 * fastest < median
