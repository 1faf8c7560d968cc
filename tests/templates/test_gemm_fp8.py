"""The gemm family's e4m3 problems: the E4M3 encoder and decoder against torch's float8_e4m3fn,
parsing and refusals, the space's FP8 rules, rendering, compiling for sm_90a without spills, the
inputs and the float64 reference against torch's float64 from the dequantized inputs."""

from __future__ import annotations

import math
import random
import shutil

import numpy as np
import pytest

from templates import get_family
from templates.family import H100_LIMITS, TemplateError, check_outputs
from templates.gemm import fp8, render, space
from templates.gemm import problem as gemm
import cores
from whole_space import whole_product

FAMILY = get_family("gemm")
REASONS = {"divisibility", "tile", "threads", "shared memory", "registers", "path", "arch", "wgmma", "tma", "split-K",
           "persistent", "cluster", "swap", "e4m3", "pingpong"}
WGMMA = dict(FAMILY.default_params(), MMA="wgmma", BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, NUM_WARPS=8, STAGES=4,
             PRODUCER_REGS=40)
EDGES = np.array([0.0, -0.0, 448.0, -448.0, 449.0, 463.9, 464.0, 465.0, 480.0, 1e9, np.inf, -np.inf, np.nan,
                  2.0**-9, -(2.0**-9), 2.0**-10, 2.0**-10 * 1.001, 3 * 2.0**-11, 5 * 2.0**-11, 2.0**-6,
                  2.0**-6 * (1 - 2.0**-5), 1.0625, 1.1875, 1.0 + 2.0**-4 * 1.001, 0.1, -3.3, 240.0, 248.0, 232.0],
                 dtype=np.float32)


def _problem(shape="1000,264,1008", scale="tensor", out="bf16", epilogue="none"):
    return FAMILY.parse_problem(shape, "e4m3", {"layout": "nt", "scale": scale, "out_dtype": out, "epilogue": epilogue})


# -- E4M3 ---------------------------------------------------------------------------------------
def test_the_encoder_rounds_as_torch_on_edge_and_random_values():
    torch = pytest.importorskip("torch")
    values = np.concatenate([EDGES, np.random.default_rng(1).standard_normal(200000).astype(np.float32) * 50,
                             np.random.default_rng(2).uniform(-2.0**-5, 2.0**-5, 20000).astype(np.float32)])
    expected = torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    got = fp8.to_e4m3(values)
    wrong = np.nonzero(got != expected)[0]
    assert wrong.size == 0, list(zip(values[wrong][:8], got[wrong][:8], expected[wrong][:8]))


def test_the_decoder_is_torchs_for_every_byte():
    torch = pytest.importorskip("torch")
    expected = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()
    assert np.array_equal(fp8.from_e4m3(np.arange(256, dtype=np.uint8)), expected, equal_nan=True)


def test_e4m3_edges_max_subnormals_nan_and_ties_to_even():
    assert fp8.from_e4m3(np.array([0x7E, 0xFE]))[0] == 448.0 == -fp8.from_e4m3(np.array([0xFE]))[0]
    assert np.isnan(fp8.from_e4m3(np.array([0x7F, 0xFF]))).all()
    assert fp8.from_e4m3(np.array([0x01]))[0] == 2.0**-9 and fp8.from_e4m3(np.array([0x08]))[0] == 2.0**-6
    assert fp8.to_e4m3(np.array([448.0, 500.0, np.inf])).tolist() == [0x7E, 0x7E, 0x7E]
    assert fp8.to_e4m3(np.array([np.nan])).tolist() in ([0x7F], [0xFF])
    # ties to even: 1 + 1/16 lies between 1 (mantissa 0) and 1.125 (mantissa 1): to 1; subnormal
    # ties 1.5 and 2.5 (times 2^-9) to 2, half of the smallest to 0
    assert fp8.to_e4m3(np.array([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 5 * 2.0**-10])).tolist() == \
        [0x38, 0x3A, 0x00, 0x02, 0x02]
    for bits in range(256):  # every finite byte decodes and encodes back to itself
        value = fp8.from_e4m3(np.array([bits]))
        if not np.isnan(value[0]) and bits != 0x80:
            assert fp8.to_e4m3(value)[0] == bits


def test_quantize_brings_each_block_to_448_with_its_scale():
    values = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    values[:, 128:256] *= 16
    bits, scales = fp8.quantize(values, (1, 128))
    assert scales.shape == (5, 3) and scales.dtype == np.float32
    decoded = fp8.from_e4m3(bits)
    assert np.allclose(np.abs(decoded[:, :128]).max(axis=1), 448.0)
    assert np.allclose(decoded * fp8.expand(scales, (1, 128), values.shape), values, rtol=0.07, atol=1e-3)
    bits, scale = fp8.quantize(values, None)
    assert scale.shape == (1,) and np.abs(fp8.from_e4m3(bits)).max() == 448.0


# -- problems -----------------------------------------------------------------------------------
def test_e4m3_problems_carry_out_and_scale_and_16_bit_problems_keep_their_keys():
    problem = _problem("4096,4096,4096", "block", "fp16", "bias")
    assert problem.key == "4096x4096x4096-e4m3-epilogue=bias-layout=nt-out_dtype=fp16-scale=block"
    assert FAMILY.problem_from_spec(problem.spec) == problem
    assert _problem("4096,4096,4096").key == "4096x4096x4096-e4m3-epilogue=none-layout=nt-out_dtype=bf16-scale=tensor"
    plain = FAMILY.parse_problem("4096,4096,4096", "bf16", {"layout": "nt"})
    assert plain.key == "4096x4096x4096-bf16-epilogue=none-layout=nt"
    assert FAMILY.parse_problem("4096,4096,4096", "bf16", {"layout": "nt", "out_dtype": "bf16"}) == plain
    assert FAMILY.distance(problem, _problem("4096,4096,4096", "tensor", "fp16", "bias")) == math.inf
    assert FAMILY.flops(problem) == 2 * 4096**3
    assert FAMILY.min_bytes(_problem("256,128,256")) == 256 * 256 + 128 * 256 + 2 * 256 * 128 + 8
    # e4m3 takes one layout: where none is given, that one (a 16-bit problem keeps the default nn)
    assert FAMILY.parse_problem("4096,4096,4096", "e4m3", {"scale": "block"}).flag("layout") == "nt"
    assert FAMILY.parse_problem("4096,4096,4096", "e4m3") == _problem("4096,4096,4096")
    assert FAMILY.parse_problem("4096,4096,4096", "bf16").flag("layout") == "nn"


@pytest.mark.parametrize("shape, flags, dtype, message", [
    ("1000,264,1000", {"layout": "nt"}, "e4m3", "K=1000 is not a multiple of 16"),
    ("1024,1024,1024", {"layout": "nn"}, "e4m3", "layout nt only"),
    ("1024,1024,1024", {"layout": "tt"}, "e4m3", "layout nt only"),
    ("1024,1024,1024", {"layout": "nt", "out_dtype": "fp32"}, "e4m3", "flag out_dtype='fp32' is not one of"),
    ("1024,1024,1024", {"layout": "nt", "scale": "row"}, "e4m3", "flag scale='row' is not one of"),
    ("1024,1024,1024", {"layout": "nt", "out_dtype": "fp16"}, "bf16", "applies to dtype e4m3 only"),
    ("1024,1024,1024", {"layout": "nt", "scale": "block"}, "fp16", "applies to dtype e4m3 only"),
])
def test_bad_e4m3_problems_fail_with_one_line(shape, flags, dtype, message):
    with pytest.raises(TemplateError, match=message) as info:
        FAMILY.parse_problem(shape, dtype, flags)
    assert "\n" not in str(info.value)


# -- the space ----------------------------------------------------------------------------------
def test_e4m3_is_taken_on_the_wgmma_path_128_deep_only():
    problem = _problem("4096,4096,4096")
    assert FAMILY.check(WGMMA, problem, H100_LIMITS) is None
    assert FAMILY.check(FAMILY.default_params(), problem, H100_LIMITS).startswith("e4m3: on the wgmma path only")
    assert FAMILY.check(dict(WGMMA, BLOCK_K=64), problem, H100_LIMITS).startswith("wgmma: BLOCK_K=128 for e4m3")
    bf16 = FAMILY.parse_problem("4096,4096,4096", "bf16", {"layout": "nt"})
    assert FAMILY.check(WGMMA, bf16, H100_LIMITS).startswith("wgmma: BLOCK_K=64 for bf16")
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCK_K=128), bf16, H100_LIMITS).startswith("path: BLOCK_K=128")
    # a stage is 128 bytes deep either way
    assert space.stage_bytes(WGMMA, "nt") == space.stage_bytes(dict(WGMMA, BLOCK_K=64), "nt") == 256 * 128


def test_block_scales_take_tiles_of_one_b_scale_and_room_for_two_accumulator_sets():
    problem = _problem("4096,4096,4096", "block")
    assert FAMILY.check(WGMMA, problem, H100_LIMITS) is None
    assert "BLOCK_N in [64, 128]" in FAMILY.check(dict(WGMMA, BLOCK_N=256), problem, H100_LIMITS)
    assert "BLOCK_N in [64, 128]" in FAMILY.check(dict(WGMMA, BLOCK_N=192), problem, H100_LIMITS)
    small = _problem("64,4096,4096", "block")
    swapped = dict(WGMMA, BLOCK_M=64, BLOCK_N=128, NUM_WARPS=4, PRODUCER_REGS=0, SWAP_AB=1, STAGES=8)
    assert FAMILY.check(swapped, small, H100_LIMITS).startswith("e4m3: block scales with SWAP_AB=0")
    assert FAMILY.check(swapped, _problem("64,4096,4096"), H100_LIMITS) is None  # per tensor: swapped
    heavy = dict(WGMMA, NUM_WARPS=4)  # one consumer warpgroup of 128 x 128: 128 accumulators
    assert FAMILY.check(heavy, problem, H100_LIMITS).startswith("registers: e4m3 keeps two sets")
    assert FAMILY.check(heavy, _problem("4096,4096,4096"), H100_LIMITS).startswith("registers: e4m3 keeps two sets")
    for config in FAMILY.valid_configs(problem, H100_LIMITS):
        assert config["BLOCK_N"] in space.FP8_BLOCK_N and not config["SWAP_AB"]
        assert space.accumulators(config) <= space.MAX_PROMOTED_ACCUMULATORS


def test_per_tensor_scales_take_two_sets_of_96_with_setmaxnreg_and_k_whole():
    problem = _problem("4096,4096,4096")
    wide = dict(WGMMA, BLOCK_N=192)  # 128 x 192 on two consumer warpgroups: 96 accumulators a set
    assert space.accumulators(wide) == 96 and FAMILY.check(wide, problem, H100_LIMITS) is None
    assert "BLOCK_N in [64, 128]" in FAMILY.check(wide, _problem("4096,4096,4096", "block"), H100_LIMITS)
    plain = FAMILY.check(dict(wide, PRODUCER_REGS=0), problem, H100_LIMITS)
    assert plain.startswith("registers: e4m3's two sets of 96 accumulators beside 48 more spill in 168"), plain
    deep = _problem("512,1024,8192")  # few tiles, K long: K in parts is accepted
    split = FAMILY.check(dict(wide, SPLIT_K=2), deep, H100_LIMITS)
    assert split.startswith("registers: e4m3 keeps two sets of 96") and "at most 64 a set with K in parts" in split
    assert FAMILY.check(dict(WGMMA, SPLIT_K=2), deep, H100_LIMITS) is None  # 64 a set: K in parts too
    assert FAMILY.check(dict(WGMMA, BLOCK_N=256), problem, H100_LIMITS).startswith("registers: e4m3 keeps two sets of 128")
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    assert any(space.accumulators(c) == 96 and c["PINGPONG"] for c in valid)
    assert all(space.accumulators(c) <= 64 for c in valid if c["SPLIT_K"] > 1)
    # at the launch's cap (no setmaxnreg) only one consumer warpgroup of 255 registers holds two sets of 96
    assert all(2 * space.accumulators(c) + 48 <= space.consumer_registers(c) for c in valid if not c["PRODUCER_REGS"])


def test_two_sets_of_a_k_blocks_products_where_three_sets_fit_with_k_whole():
    """fp8_part_sets: 2 where a thread holds three sets (two of a K block's products, the promoted
    sums) beside the other registers; with K in parts, or 96 a set, one; rendered as PART_SETS."""
    problem = _problem("4096,4096,4096")
    two = dict(WGMMA, BLOCK_N=128)  # 128 x 128 on two warpgroups: 3 x 64 + 40 in 232 after setmaxnreg
    assert space.consumer_registers(two) == 232 and space.fp8_part_sets(two) == 2
    assert space.fp8_part_sets(dict(two, BLOCK_N=192)) == 1  # 3 x 96 do not fit
    assert space.fp8_part_sets(dict(two, SPLIT_K=2)) == 1
    one_group = dict(two, BLOCK_M=64, NUM_WARPS=4, PRODUCER_REGS=0)  # 3 x 64 + 48 in the launch's 255
    assert space.fp8_part_sets(one_group) == 2
    assert "#define PART_SETS 2" in FAMILY.render(two, problem)
    assert "#define PART_SETS 1" in FAMILY.render(dict(two, BLOCK_N=192), problem)
    assert "#define PART_SETS 1" in FAMILY.render(two, FAMILY.parse_problem("4096,4096,4096", "bf16", {"layout": "nt"}))
    for config in FAMILY.valid_configs(problem, H100_LIMITS):
        sets = space.fp8_part_sets(config) + 1
        assert sets * space.accumulators(config) + space.fp8_other_registers(config) <= space.consumer_registers(config)


# Block scales by default (their rules are per-tensor's and more); per tensor in the soak tier.
@pytest.mark.parametrize("scale", [pytest.param("tensor", marks=pytest.mark.soak), "block"])
def test_the_whole_product_is_refused_with_reasons_or_among_the_valid_configs(scale):
    problem = _problem("1000,264,1008", scale, "fp16", "bias_gelu")
    checked = whole_product("gemm", problem)
    assert set(checked.summary.reasons) <= REASONS, checked.summary.reasons
    key = lambda c: tuple(sorted(c.items()))  # noqa: E731
    fast = FAMILY.valid_configs(problem, H100_LIMITS)
    assert {key(c) for c in fast} == {key(c) for c in checked.valid} and len(fast) > 500


@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_a_sample_of_every_accepted_config_renders(scale):
    problem = _problem("4097,4096,4096", scale, "bf16", "bias_gelu")
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    assert len(valid) > 1000 and all(c["MMA"] == "wgmma" and c["BLOCK_K"] == 128 for c in valid)
    assert any(c["PERSISTENT"] for c in valid) and any(c["CLUSTER_M"] > 1 for c in valid)
    small = _problem("64,4096,4096", scale, "fp16", "bias")
    small_valid = FAMILY.valid_configs(small, H100_LIMITS)
    assert any(c["SPLIT_K"] > 1 for c in small_valid)
    assert any(c["SWAP_AB"] for c in small_valid) == (scale == "tensor")
    rng = random.Random(3)
    sample = [(problem, c) for c in rng.sample(valid, 120)] + [(small, c) for c in rng.sample(small_valid, 60)]
    for problem, config in sample:
        source = FAMILY.render(config, problem)
        assert "k32.f32.e4m3.e4m3" in source and "{{" not in source and "/*%" not in source
        assert f"#define SCALE {render.SCALES[scale]}" in source and "#define ELEM_BYTES 1" in source


@pytest.mark.parametrize("shape", ["4096,4096,4096", "16,4096,4096", "1000,264,1008"])
@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_starting_points_are_valid_128_deep_wgmma_configs(shape, scale):
    problem = _problem(shape, scale)
    points = FAMILY.starting_points(problem, H100_LIMITS)
    assert len(points) >= 5 and len({tuple(sorted(p.items())) for p in points}) == len(points)
    assert all(FAMILY.check(p, problem, H100_LIMITS) is None and p["BLOCK_K"] == 128 for p in points)
    # ping-pong is persistent: refused where the work units are fewer than the multiprocessors
    assert any(p["PINGPONG"] for p in points) == (shape == "4096,4096,4096")
    assert any(p["BLOCK_N"] == 192 for p in points) == (shape == "4096,4096,4096" and scale == "tensor")


def test_the_launch_passes_one_byte_maps_and_the_scales():
    problem = _problem("1000,264,1008", "block", "fp16", "bias")
    launch = FAMILY.launch(WGMMA, problem)
    maps = [a.value for a in launch.args if a.kind == "tensormap"]
    assert [(m.buffer, m.element_bytes, m.dims, m.strides, m.box) for m in maps] == [
        ("a", 1, (1008, 1000), (1008,), (128, 128)), ("b", 1, (1008, 264), (1008,), (128, 128))]
    assert [a.value for a in launch.args if a.kind == "buffer"] == ["scale_a", "scale_b", "bias", "c"]
    assert launch.smem_bytes == space.smem_bytes(WGMMA, "nt") == 4 * 256 * 128 + 1024 + 16 * 4 + 16
    assert launch.grid == (8 * 3, 1, 1)
    source = FAMILY.render(WGMMA, problem)
    assert "const float* __restrict__ scale_a, const float* __restrict__ scale_b" in source
    assert "cvt.rn.f16x2.f32" in source and "e4m3 out_dtype=fp16 scale=block" in source


def test_the_triton_fp8_space_takes_one_scale_a_step():
    from templates.gemm import triton_peer

    space_ = triton_peer.FP8_CONFIG_SPACE
    assert len(set(space_)) == len(space_) >= 6 and triton_peer.SCALE_BLOCK == gemm.SCALE_BLOCK
    assert all(gemm.SCALE_BLOCK % block_k == 0 for _, _, block_k, _, _ in space_)


def test_exports_refuse_e4m3_problems_in_one_line():
    from tuner.answers.dispatch import refuse_unexported
    from tuner.errors import UsageError

    reason = FAMILY.export_refusal(_problem())
    assert reason and "e4m3" in reason and "\n" not in reason
    plain = FAMILY.parse_problem("64,64,64", "bf16", {"layout": "nt"})
    assert FAMILY.export_refusal(plain) is None
    refuse_unexported(FAMILY, [plain])
    with pytest.raises(UsageError, match="take fp16 and bf16 problems only, not e4m3"):
        refuse_unexported(FAMILY, [plain, _problem()])


# -- inputs and the reference -------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_inputs_cover_e4m3s_range_and_are_seeded(scale):
    problem = _problem("300,200,400", scale, "bf16", "bias")
    inputs = FAMILY.inputs(problem, 5)
    assert inputs["a"].dtype == np.uint8 and inputs["a"].shape == (300, 400) and inputs["b"].shape == (200, 400)
    shapes = {"tensor": ((1,), (1,)), "block": ((300, 4), (2, 4))}[scale]
    assert (inputs["scale_a"].shape, inputs["scale_b"].shape) == shapes
    assert inputs["scale_a"].dtype == inputs["scale_b"].dtype == np.float32
    for name in ("a", "b"):
        decoded = fp8.from_e4m3(inputs[name])
        assert np.abs(decoded).max() == 448.0 and np.count_nonzero(decoded) > 0.95 * decoded.size
        assert len(np.unique(inputs[name])) > 200  # most of the 254 finite bytes
    again = FAMILY.inputs(problem, 5)
    assert all(np.array_equal(inputs[n], again[n]) for n in inputs)
    assert not np.array_equal(inputs["a"], FAMILY.inputs(problem, 6)["a"])
    assert FAMILY.input_shapes(problem)["scale_a"] == (shapes[0], "fp32")
    assert FAMILY.input_shapes(problem)["a"] == ((300, 400), "e4m3")


def _torch_reference(problem, inputs):
    """C in float64 by torch from the inputs decoded by torch and dequantized there."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def dequantized(name, block):
        values = torch.from_numpy(inputs[name]).view(torch.float8_e4m3fn).double()
        scales = torch.from_numpy(inputs[f"scale_{name}"]).double()
        if problem.flag("scale") == "tensor":
            return values * scales[0]
        full = scales.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
        return values * full[:values.shape[0], :values.shape[1]]

    c = dequantized("a", (1, 128)) @ dequantized("b", (128, 128)).T
    epilogue = problem.flag("epilogue")
    if epilogue != "none":
        bits = torch.from_numpy(inputs["bias"].view(np.int16))
        bias = bits.view(torch.float16 if problem.flag("out_dtype") == "fp16" else torch.bfloat16).double()
        c = c + bias
    if epilogue == "bias_relu":
        c = F.relu(c)
    elif epilogue == "bias_gelu":
        c = F.gelu(c)
    elif epilogue == "bias_gelu_tanh":
        c = F.gelu(c, approximate="tanh")
    return c.numpy()


@pytest.mark.parametrize("shape, scale, out, epilogue", [
    ("77,45,304", "tensor", "bf16", "none"), ("77,45,304", "block", "bf16", "bias"),
    ("130,260,272", "block", "fp16", "bias_gelu"), ("33,129,400", "tensor", "fp16", "bias_relu"),
    ("200,300,528", "block", "bf16", "bias_gelu_tanh"),
])
def test_the_reference_is_torchs_float64_from_the_dequantized_inputs(shape, scale, out, epilogue):
    problem = _problem(shape, scale, out, epilogue)
    inputs = FAMILY.inputs(problem, 3)
    rows = np.arange(problem.shape[0])
    ours = gemm.reference_rows(problem, inputs, rows)
    assert np.allclose(ours, _torch_reference(problem, inputs), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("scale, out", [("tensor", "bf16"), ("block", "fp16"), ("block", "bf16")])
def test_validate_accepts_c_rounded_and_catches_a_lost_scale_or_k_block(scale, out):
    problem = _problem("130,260,528", scale, out, "bias")
    inputs = FAMILY.inputs(problem, 4)
    rows = np.arange(problem.shape[0])
    good = gemm.to_bits(gemm.reference_rows(problem, inputs, rows).astype(np.float32), out)
    result = check_outputs(FAMILY, problem, inputs, {"c": good})
    assert result.ok and result.error < gemm.tolerance(problem) / 2, result
    assert FAMILY.outputs(problem)[0].poison == gemm.POISON[out] and FAMILY.outputs(problem)[0].element == out
    wrong_scale = dict(inputs, scale_b=inputs["scale_b"] * np.float32(1.05))
    if scale == "block":  # one K block's scales of B off
        wrong_scale["scale_b"] = inputs["scale_b"].copy()
        wrong_scale["scale_b"][:, 1] *= 2
    bad = gemm.to_bits(gemm.reference_rows(problem, wrong_scale, rows).astype(np.float32), out)
    assert not FAMILY.validate(problem, inputs, {"c": bad}).ok
    lost = dict(inputs, a=inputs["a"].copy())
    lost["a"][:, 128:160] = 0  # one 32-deep slice of K
    bad = gemm.to_bits(gemm.reference_rows(problem, lost, rows).astype(np.float32), out)
    result = FAMILY.validate(problem, inputs, {"c": bad})
    assert not result.ok and "e4m3 to" in result.reason


# -- compiling for sm_90a (CPU only) -------------------------------------------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_a_sample_of_hopper_configs_compiles_for_sm90a_without_spilling(scale, tmp_path):
    """Random accepted configs, the heaviest accumulators, and persistent, clustered, split-K,
    C-by-TMA and (per tensor) swapped configs, with the heaviest epilogue."""
    from workers.results import CompileRequest

    problem = _problem("4097,4096,4096", scale, "bf16", "bias_gelu")
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    rng = random.Random(8)
    heaviest = max(valid, key=lambda c: (space.accumulators(c), c["SPLIT_K"], c["STAGES"]))
    jobs = [(problem, c) for c in rng.sample(valid, 2) + [heaviest]]
    for name, value in (("PERSISTENT", 1), ("CLUSTER_M", 2), ("C_STORE", "tma")):
        jobs.append((problem, rng.choice([c for c in valid if c[name] == value])))
    small = _problem("64,4096,4096", scale, "fp16", "bias")
    small_valid = FAMILY.valid_configs(small, H100_LIMITS)
    jobs.append((small, rng.choice([c for c in small_valid if c["SPLIT_K"] > 1])))
    if scale == "tensor":
        jobs.append((small, rng.choice([c for c in small_valid if c["SWAP_AB"]])))
    requests = [CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
                for problem, params in jobs]
    for (problem, params), binary in zip(jobs, cores.compile_each(requests, tmp_path)):
        resources = binary.resources
        assert resources is not None and 32 <= resources.registers <= 255, params
        assert resources.spill_stores == 0 and resources.stack_bytes == 0, (problem.key, params, resources)
