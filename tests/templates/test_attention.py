"""The attention family on the CPU: space, constraints, rendering, compiling, reference."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from templates import elements, get_family
from templates.attention import problem as attn
from templates.attention import space
from templates.family import (
    H100_LIMITS,
    DeviceLimits,
    KernelArg,
    Launch,
    TemplateError,
    TensorMap,
    check_outputs,
)
import cores
from whole_space import whole_product

FAMILY = get_family("attention")
PROBLEMS = [
    FAMILY.parse_problem(shape, dtype, {"causal": causal})
    for shape in ("2,3,1000,64", "1,2,4097,128")
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]


REASONS = {"divisibility", "shared memory", "registers", "layout", "threads", "arch", "path", "irrelevant", "tile",
           "stages"}


# The problems whose whole product is checked config by config (whole_space.py: one pass a problem,
# about 40 s, shared by the tests below), in the soak tier (``pytest -m soak``): D=128 (the tighter
# registers and shared memory), a sequence no tile divides, causal, bf16; D=64 with and without the
# mask, fp16 and bf16; 4x16x4096x128 fp16; D=96 (causal bf16) and D=256. Every problem's enumerated configs render in the
# default run (test_every_valid_config_of_every_problem_renders).
WHOLE = [
    pytest.param(p, id=p.key, marks=pytest.mark.soak)
    for p in (PROBLEMS[7], PROBLEMS[1], PROBLEMS[0], PROBLEMS[3], PROBLEMS[6],
              FAMILY.parse_problem("4,16,4096,128", "fp16"),
              FAMILY.parse_problem("2,3,1000,96", "bf16", {"causal": True}), FAMILY.parse_problem("1,2,4097,256", "fp16"))
]
# D=96 (swizzled tiles and wgmma's O accumulator padded to 128 columns) and D=256.
WIDE = [FAMILY.parse_problem(f"2,3,1000,{d}", dtype, {"causal": causal})
        for d in (96, 256) for dtype, causal in (("fp16", False), ("bf16", True))]
PATHS = (("cp.async", "sync"), ("cp.async", "wgmma"), ("tma", "wgmma"))


def _assert_renders(config, problem) -> None:
    source = FAMILY.render(config, problem)
    assert "attention_fwd" in source and "{{" not in source and "/*%" not in source
    assert f"#define BLOCK_M {config['BLOCK_M']}" in source
    assert ("bf16.bf16" in source) == (problem.dtype == "bf16")
    assert f"#define CAUSAL {int(problem.flag('causal'))}" in source
    assert ("cp.async.bulk.tensor" in source) == (config["LOADS"] == "tma")


@pytest.mark.parametrize("problem", WHOLE)
def test_every_config_renders_or_is_rejected_with_a_reason(problem):
    checked = whole_product("attention", problem)
    assert set(checked.summary.reasons) <= REASONS, checked.summary.reasons
    for config in checked.valid:
        _assert_renders(config, problem)
    least = 50 if problem.shape[3] == 256 else 100  # D=256: 72 TMA configs without the mask
    assert len(checked.valid) > least and sum(c["LOADS"] == "tma" for c in checked.valid) > least


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_every_valid_config_of_every_problem_renders(problem):
    """Each problem's valid configs, as the family enumerates them (the whole product's, where
    test_valid_configs_are_those_of_the_whole_product checks it), render."""
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    for config in valid:
        _assert_renders(config, problem)
    assert len(valid) > 100 and sum(c["LOADS"] == "tma" for c in valid) > 100


def test_the_default_config_is_the_one_before_the_tma_path():
    default = FAMILY.default_params()
    assert default == dict(BLOCK_M=64, BLOCK_N=32, NUM_WARPS=4, STAGES=1, SMEM_LAYOUT="pad8", WARP_SPECIALIZED=0,
                           Q_IN_REGS=1, MMA="sync", LOADS="cp.async", PRODUCER_REGS=0, INTRA_OVERLAP=0, PINGPONG=0,
                           EPILOGUE="st16", SCHEDULE="grid", TILE_ORDER="head",
                           BLOCKS_PER_SM=1)


def test_tma_path_parameters_take_their_first_value_elsewhere():
    """No two configs render the same kernel: the TMA path's parameters are fixed off it, and the
    cp.async paths' are fixed on it."""
    problem = PROBLEMS[3]  # D=64 bf16 causal
    old = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8)
    assert FAMILY.check(old, problem, H100_LIMITS) is None
    for name, value in (("PRODUCER_REGS", 24), ("INTRA_OVERLAP", 1), ("PINGPONG", 1), ("EPILOGUE", "tma")):
        assert FAMILY.check(dict(old, **{name: value}), problem, H100_LIMITS).startswith("irrelevant")
    for name, value in (("BLOCK_N", 96), ("STAGES", 4)):
        assert FAMILY.check(dict(old, **{name: value}), problem, H100_LIMITS).startswith("path")
    tma = dict(old, MMA="wgmma", SMEM_LAYOUT="swizzle", WARP_SPECIALIZED=1, LOADS="tma", STAGES=2, BLOCK_N=128,
               Q_IN_REGS=0)
    assert FAMILY.check(tma, problem, H100_LIMITS) is None
    for name, value in (("MMA", "sync"), ("SMEM_LAYOUT", "pad8"), ("WARP_SPECIALIZED", 0)):
        assert FAMILY.check(dict(tma, **{name: value}), problem, H100_LIMITS).startswith("irrelevant")
    assert FAMILY.check(dict(tma, BLOCK_M=64, NUM_WARPS=4, PINGPONG=1), problem, H100_LIMITS).startswith("irrelevant")
    assert FAMILY.check(dict(tma, STAGES=1), problem, H100_LIMITS).startswith("stages")
    assert FAMILY.check(dict(tma, BLOCK_N=32), problem, H100_LIMITS).startswith("tile")
    assert FAMILY.check(dict(tma, Q_IN_REGS=1), problem, H100_LIMITS).startswith("irrelevant")
    sources = {}
    for config in FAMILY.valid_configs(problem, H100_LIMITS):
        if config["LOADS"] == "tma":
            body = FAMILY.render(config, problem).split("\n", 2)[2]  # without the comment naming the config
            assert body not in sources, (config, sources.get(body))
            sources[body] = config
    assert len(sources) > 300


def test_tma_path_registers_follow_setmaxnreg():
    tma = dict(FAMILY.default_params(), MMA="wgmma", SMEM_LAYOUT="swizzle", WARP_SPECIALIZED=1, LOADS="tma", STAGES=2,
               BLOCK_N=128, Q_IN_REGS=0)
    for warps, producer, consumer in ((4, 24, 240), (4, 56, 240), (8, 24, 240), (8, 40, 232), (8, 56, 224),
                                      (12, 24, 160), (12, 56, 152), (8, 0, 168), (12, 0, 128)):
        params = dict(tma, BLOCK_M=16 * warps, NUM_WARPS=warps, PRODUCER_REGS=producer)
        assert space.consumer_registers(params) == consumer
        regs = space.launch_registers(params)
        if producer:  # what the producer gives up covers what the consumers take
            assert producer + warps // 4 * consumer <= (1 + warps // 4) * min(256, regs + 7 & ~7)
    problem = FAMILY.parse_problem("1,1,4096,128", "fp16")
    big = dict(tma, BLOCK_M=128, NUM_WARPS=8, BLOCK_N=192, INTRA_OVERLAP=1)
    assert FAMILY.check(dict(big, PRODUCER_REGS=24), problem, H100_LIMITS).startswith("registers")
    assert FAMILY.check(dict(big, BLOCK_N=128, PRODUCER_REGS=24), problem, H100_LIMITS) is None
    assert FAMILY.check(dict(big, BLOCK_N=128, PRODUCER_REGS=0), problem, H100_LIMITS).startswith("registers")


def test_constraints_reject_what_cannot_fit():
    problem = FAMILY.parse_problem("1,1,4096,128", "fp16")
    big = dict(FAMILY.default_params(), BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, STAGES=3, SMEM_LAYOUT="pad16",
               WARP_SPECIALIZED=0, Q_IN_REGS=0, MMA="sync")
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


@pytest.mark.parametrize("problem", WHOLE)
def test_space_summary_counts_valid_and_rejected(problem):
    summary = whole_product("attention", problem).summary  # summarize_space's count
    assert summary.total == math.prod(len(p.choices) for p in FAMILY.params)
    assert 0 < summary.valid < summary.total
    assert summary.valid + sum(summary.reasons.values()) == summary.total


@pytest.mark.parametrize(
    "shape, dtype, message",
    [
        ("4,16,4096", "fp16", "malformed shape"),
        ("4,16,x,128", "fp16", "malformed shape"),
        ("4,16,0,128", "fp16", "malformed shape"),
        ("4,16,4096,80", "fp16", "unsupported head dimension"),
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
    problem = FAMILY.parse_problem("3,5,4097,64", "bf16", {"causal": True})
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, WARP_SPECIALIZED=1)
    launch = FAMILY.launch(params, problem)
    assert launch.grid == (math.ceil(4097 / 128), 5, 3)
    assert launch.block == (9 * 32, 1, 1)
    assert launch.smem_bytes == space.smem_bytes(params, 64)
    assert [a.kind for a in launch.args] == ["buffer"] * 4 + ["i32", "i32", "f32"]
    assert [a.value for a in launch.args[4:6]] == [4097, 1]  # S, and the query heads a KV head serves
    assert launch.args[6].value == pytest.approx(math.log2(math.e) / 8)


def test_tma_launch_carries_tensor_maps_as_plain_json():
    problem = FAMILY.parse_problem("3,5,4097,128", "bf16", {"causal": True})
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=176, STAGES=2, SMEM_LAYOUT="swizzle",
                  WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1)
    launch = FAMILY.launch(params, problem)
    tiles = math.ceil(4097 / 128) * 5 * 3  # a 1-D grid of work tiles, a block each
    assert launch.grid == (tiles, 1, 1) and launch.block == (3 * 128, 1, 1)
    assert launch.blocks_per_sm_cap == 0 and launch.grid_on(132) == launch.grid
    assert launch.smem_bytes == space.smem_bytes(params, 128) == 2 * 128 * (128 + 4 * 176) + 1024 + 8 * 11
    assert [a.kind for a in launch.args] == ["tensormap"] * 4 + ["buffer", "i32", "i32", "i32", "f32"]
    assert [a.value for a in launch.args[5:8]] == [4097, 15, 1]  # S, B*H (the tiles' heads), the group
    maps = [a.value for a in launch.args[:4]]
    assert [m.buffer for m in maps] == ["q", "k", "v", "o"]
    assert [m.box for m in maps] == [(64, 128, 1), (64, 176, 1), (64, 176, 1), (64, 64, 1)]
    for m in maps:
        assert m.dims == (128, 4097, 15) and m.strides == (256, 256 * 4097) and m.swizzle == 128
        assert m.element_bytes == 2
    document = json.loads(json.dumps(launch.to_json()))  # plain JSON all the way down
    assert document["args"][0] == {"kind": "tensormap", "value": {
        "buffer": "q", "element_bytes": 2, "dims": [128, 4097, 15], "strides": [256, 256 * 4097],
        "box": [64, 128, 1], "swizzle": 128, "l2_promotion": 128}}
    again = tuple(KernelArg(a["kind"], a["value"]) for a in document["args"])  # as an exported launch is read
    assert again == launch.args


def test_persistent_launch_caps_its_grid_at_the_blocks_the_sms_hold():
    problem = FAMILY.parse_problem("3,5,4097,64", "fp16", {"causal": True})
    params = dict(FAMILY.default_params(), BLOCK_M=64, NUM_WARPS=4, BLOCK_N=128, STAGES=2, SMEM_LAYOUT="swizzle",
                  WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1,
                  SCHEDULE="persistent", BLOCKS_PER_SM=2)
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    launch = FAMILY.launch(params, problem)
    tiles = math.ceil(4097 / 64) * 15
    assert launch.grid == (tiles, 1, 1) and launch.blocks_per_sm_cap == 2
    assert launch.grid_on(132) == (264, 1, 1) and launch.grid_on(1000) == (tiles, 1, 1)
    document = json.loads(json.dumps(launch.to_json()))
    assert document["grid_x_max_blocks_per_sm"] == 2 and Launch.from_json(document) == launch
    # its tile counter: a workspace buffer, the kernel's last argument
    assert launch.workspace == (("tile_counter", 8),) and launch.args[-1] == KernelArg("buffer", "tile_counter")
    assert "int* __restrict__ tile_counter" in FAMILY.render(params, problem)
    # O is staged apart from Q: one more Q-sized tile of shared memory than a block a tile
    grid = FAMILY.launch(dict(params, SCHEDULE="grid"), problem)
    assert launch.smem_bytes - grid.smem_bytes == 2 * 64 * 64 and grid.blocks_per_sm_cap == 0
    assert grid.workspace == () and "int* __restrict__ tile_counter" not in FAMILY.render(dict(params, SCHEDULE="grid"), problem)
    source = FAMILY.render(params, problem)
    assert "__launch_bounds__(NTHREADS, BLOCKS_PER_SM)" in source and "#define BLOCKS_PER_SM 2" in source
    assert "#define PERSISTENT 1" in source


def test_two_blocks_an_sm_halve_the_registers_and_must_share_its_shared_memory():
    problem = FAMILY.parse_problem("2,4,1000,128", "fp16", {"causal": False})
    one = dict(FAMILY.default_params(), BLOCK_M=64, NUM_WARPS=4, BLOCK_N=64, STAGES=2, SMEM_LAYOUT="swizzle",
               WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1)
    two = dict(one, BLOCKS_PER_SM=2)
    assert space.launch_registers(one) == 255 and space.launch_registers(two) == 128
    assert space.consumer_registers(two) == 232  # 2 x 128 a thread pair, less the producer's 24
    assert FAMILY.check(two, problem, H100_LIMITS) is None
    reason = FAMILY.check(dict(two, BLOCK_N=128), problem, H100_LIMITS)  # 148 KB a block
    assert reason and reason.startswith("shared memory: 2 blocks")
    assert FAMILY.check(dict(two, BLOCK_M=128, NUM_WARPS=8, BLOCK_N=64), problem, H100_LIMITS).startswith("registers")
    # without setmaxnreg two blocks leave the consumers 128 registers: 48 kept free (ptxas spilled with 32)
    plain = FAMILY.parse_problem("2,4,1000,64", "fp16", {"causal": False})
    lean = dict(two, PRODUCER_REGS=0, INTRA_OVERLAP=0)
    assert space.fragment_registers(lean, 64) == 80 and FAMILY.check(lean, plain, H100_LIMITS) is None
    assert FAMILY.check(dict(lean, INTRA_OVERLAP=1), plain, H100_LIMITS).startswith("registers: 96 fragment registers (+48")
    # off the TMA path the choice does not exist
    assert FAMILY.check(dict(FAMILY.default_params(), BLOCKS_PER_SM=2), problem, H100_LIMITS).startswith("irrelevant")


def test_tensor_maps_refuse_what_the_driver_cannot_encode():
    good = dict(buffer="q", element_bytes=2, dims=(64, 10, 2), strides=(128, 1280), box=(64, 64, 1))
    assert TensorMap(**good).to_json()["dims"] == [64, 10, 2]
    for bad in (dict(strides=(128,)), dict(strides=(100, 1280)), dict(box=(64, 512, 1)), dict(swizzle=96),
                dict(box=(128, 64, 1)), dict(element_bytes=3), dict(dims=(64, 0, 2))):
        with pytest.raises(TemplateError, match="tensor map over 'q'"):
            TensorMap(**dict(good, **bad))
    with pytest.raises(TemplateError, match="unknown kernel argument kind"):
        KernelArg("pointer", "q")


def test_problems_that_share_d_dtype_and_causal_share_each_configs_source():
    """B, H and S are kernel arguments: one source, one cubin in the compile cache, for them all."""
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8)
    one, other = (FAMILY.parse_problem(shape, "fp16", {"causal": True}) for shape in ("2,8,1024,64", "1,16,4097,64"))
    assert FAMILY.render(params, one) == FAMILY.render(params, other)
    assert FAMILY.launch(params, one).grid != FAMILY.launch(params, other).grid
    for changed in (FAMILY.parse_problem("2,8,1024,64", "bf16", {"causal": True}),
                    FAMILY.parse_problem("2,8,1024,64", "fp16", {"causal": False}),
                    FAMILY.parse_problem("2,8,1024,128", "fp16", {"causal": True})):
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
            out[b, h] = attn.reference_rows(q, k, v, np.arange(problem.shape[2]), problem.flag("causal"))
    return attn.to_bits(out.astype(np.float32), problem.dtype)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_validate_accepts_a_correct_output_and_rejects_broken_ones(dtype, causal):
    problem = FAMILY.parse_problem("2,2,77,64", dtype, {"causal": causal})
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
    other = FAMILY.parse_problem("2,2,77,64", dtype, {"causal": not causal})
    assert not FAMILY.validate(other, inputs, {"o": good}).ok


def test_bf16_bits_round_trip():
    exact = np.array([1.0, -2.5, 3.140625, 65536.0], dtype=np.float32)
    assert np.array_equal(attn.from_bits(attn.to_bits(exact, "bf16"), "bf16"), exact.astype(np.float64))
    ties = np.array([1.00390625, 1.01171875], dtype=np.float32)  # halfway: round to even
    assert attn.from_bits(attn.to_bits(ties, "bf16"), "bf16").tolist() == [1.0, 1.015625]


# -- compiling for sm_90a (CPU only) -------------------------------------------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_sample_of_configs_compiles_for_sm90a_and_reports_resources(tmp_path):
    from workers.results import CompileRequest

    rng = random.Random(7)
    problems = [FAMILY.parse_problem("2,4,1000,64", "fp16", {"causal": True}), FAMILY.parse_problem("1,2,4097,128", "bf16")]
    jobs = []
    for problem in problems:
        valid = FAMILY.valid_configs(problem, H100_LIMITS)
        sample = rng.sample(valid, 3)
        sample.append(next(c for c in valid if c["WARP_SPECIALIZED"] == 1 and c["STAGES"] == 3))
        jobs += [(problem, params) for params in sample]
    requests = [CompileRequest(FAMILY.render(params, problem), "attention_fwd", FAMILY.compile_options(params, problem))
                for problem, params in jobs]
    for (problem, params), binary in zip(jobs, cores.compile_each(requests, tmp_path)):
        assert binary.cubin[:4] == b"\x7fELF"
        assert binary.resources is not None and 32 <= binary.resources.registers <= 255, params


def test_starting_points_are_valid_and_lead_with_the_warpgroup_tiles():
    for shape, dtype, flags in FAMILY.suite:
        problem = FAMILY.parse_problem(shape, dtype, flags)
        points = FAMILY.starting_points(problem, H100_LIMITS)
        assert points and all(FAMILY.check(p, problem, H100_LIMITS) is None for p in points)
        assert points[0]["LOADS"] == "tma" and any(p["MMA"] == "sync" for p in points)
        b, h, s, d = problem.shape
        few = [p for p in points if p["BLOCK_M"] == 64 and p["LOADS"] == "tma"]
        if b * h * -(-s // 128) < H100_LIMITS.sm_count:  # 1x8x512, 2x8x512: one consumer warpgroup first
            assert len(few) >= 1 and points[:len(few)] == few and all(p["NUM_WARPS"] == 4 for p in few)
        else:
            assert not few
        lead = points[len(few)]
        first = (lead["BLOCK_M"], lead["BLOCK_N"], lead["INTRA_OVERLAP"], lead["PINGPONG"])
        assert first == ((128, 160, 1, 1) if d == 128 else (128, 176, 1, 1))  # the H200's fastest
        if d == 64:  # persistent blocks with the TMA store (H200, 2026-11-23)
            assert (lead["SCHEDULE"], lead["EPILOGUE"]) == ("persistent", "tma")
        # under the causal mask the longest-first order is among them, without it never
        assert any(p["TILE_ORDER"] == "lpt" for p in points) == problem.flag("causal")
        cp_async = [p for p in points if p["LOADS"] == "cp.async"]  # then the recorded landscapes' winners
        assert cp_async and (cp_async[0]["STAGES"], cp_async[0]["Q_IN_REGS"]) == (
            (3, 1) if problem.shape[3] == 128 else (2, 0))
        assert len({tuple(sorted(p.items())) for p in points}) == len(points)
    older = DeviceLimits("sm80", (8, 0), 108, max_smem_per_block_optin=163 * 1024)
    assert all(p["MMA"] == "sync" for p in FAMILY.starting_points(PROBLEMS[0], older))


def test_inputs_are_the_same_whatever_the_threads(monkeypatch):
    problem = FAMILY.parse_problem("2,3,1000,64", "bf16")
    monkeypatch.setattr(elements, "INPUT_BLOCK", 4096)  # many blocks on a small problem
    many = FAMILY.inputs(problem, seed=7)
    monkeypatch.setattr(elements.os, "cpu_count", lambda: 1)
    one = FAMILY.inputs(problem, seed=7)
    assert all(np.array_equal(many[n], one[n]) for n in ("q", "k", "v"))
    assert not np.array_equal(many["q"], FAMILY.inputs(problem, seed=8)["q"])
    assert not np.array_equal(many["q"], many["k"])
    values = attn.from_bits(many["v"], "bf16")
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1) < 0.02


def test_older_configs_complete_to_the_kernels_they_were():
    """A landscape recorded before the TMA path: its configs complete to the cp.async paths' own,
    and the space they span holds none of the TMA path's choices."""
    older = [dict(BLOCK_M=128, BLOCK_N=64, NUM_WARPS=8, STAGES=2, SMEM_LAYOUT="swizzle", WARP_SPECIALIZED=0,
                  Q_IN_REGS=0, MMA="wgmma"),
             dict(BLOCK_M=64, BLOCK_N=128, NUM_WARPS=4, STAGES=3, SMEM_LAYOUT="pad8", WARP_SPECIALIZED=1,
                  Q_IN_REGS=1, MMA="sync")]
    problem = PROBLEMS[0]
    for config in older:
        full = FAMILY.complete(config)
        assert full == dict(config, LOADS="cp.async", PRODUCER_REGS=0, INTRA_OVERLAP=0, PINGPONG=0, EPILOGUE="st16",
                            SCHEDULE="grid", TILE_ORDER="head", BLOCKS_PER_SM=1)
        assert FAMILY.check(full, problem, H100_LIMITS) is None
    recorded = {p.name: p.choices for p in FAMILY.recorded_space(older)}
    assert recorded["LOADS"] == ("cp.async",) and recorded["EPILOGUE"] == ("st16",)
    assert recorded["BLOCK_M"] == (64, 128) and recorded["STAGES"] == (2, 3) and recorded["MMA"] == ("sync", "wgmma")


def test_a_study_replays_the_head_dim_256_landscape_by_name(tmp_path, module_ray):
    """Every valid config of 2x8x1024x256 fp16 causal, recorded on an H200 (2026-11-29) with the
    template 7166523ae1924f26: a replay by its name comes within 10% of its best (38 of the 347
    configs are), well under its median (1.38x the best). No re-timing: a replay's trials in flight make its
    sequence vary from run to run, and the re-timing's pick among ties (fewer registers) with it."""
    import tuner
    from workers.replay import landscape_json

    name = "attention_2x8x1024x256-fp16-causal_h200"
    landscape = landscape_json(Path(attn.__file__).parent / "landscapes" / f"{name}.json.gz")
    problem = FAMILY.parse_problem("2,8,1024,256", "fp16", {"causal": True})
    assert landscape["template_hash"] == "7166523ae1924f26"
    assert len(landscape["entries"]) == len(FAMILY.valid_configs(problem, H100_LIMITS))
    times = sorted(e["measurement"]["timing"]["median_ms"] for e in landscape["entries"] if e["measurement"]["ok"])
    result = tuner.tune("attention", "2,8,1024,256", "fp16", {"causal": True}, trials=24, replay=name,
                        db=f"sqlite:///{tmp_path / 'replay.db'}", seed=0, retime=0)
    assert result.status == "finished" and result.measured == 24 and result.failed == 0
    assert result.best.median_ms <= 1.10 * times[0] < times[len(times) // 2]


@pytest.mark.parametrize("problem", WHOLE)
def test_valid_configs_are_those_of_the_whole_product(problem):
    """The family enumerates its valid configs among the path rules' candidates: the same set as
    checking every config of the product (which cost a study 10 s before its first trial)."""
    everything = whole_product("attention", problem).valid  # KernelFamily.valid_configs's list
    fast = FAMILY.valid_configs(problem, H100_LIMITS)
    key = lambda c: tuple(sorted(c.items()))  # noqa: E731
    assert len(fast) == len({key(c) for c in fast})
    assert {key(c) for c in fast} == {key(c) for c in everything}
    assert any(c["LOADS"] == "tma" for c in fast) and any(c["LOADS"] == "cp.async" for c in fast)


def test_the_longest_first_order_is_a_choice_under_the_causal_mask_only():
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=128, STAGES=2, SMEM_LAYOUT="swizzle",
                  WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1,
                  PINGPONG=1, TILE_ORDER="lpt")
    causal = FAMILY.parse_problem("2,3,1000,64", "fp16", {"causal": True})
    plain = FAMILY.parse_problem("2,3,1000,64", "fp16", {"causal": False})
    assert FAMILY.check(params, causal, H100_LIMITS) is None
    assert "#define LPT_ORDER 1" in FAMILY.render(params, causal)
    assert FAMILY.check(params, plain, H100_LIMITS).startswith("irrelevant")


def test_grouped_query_shapes_parse_and_normalize():
    gqa = FAMILY.parse_problem("2,32,1000,128,8", "bf16", {"causal": True})
    assert gqa.shape == (2, 32, 1000, 128, 8) and gqa.key == "2x32x1000x128x8-bf16-causal"
    assert FAMILY.parse_problem("2,8,1000,128,8", "bf16").shape == (2, 8, 1000, 128)  # HKV = H: plain
    assert FAMILY.parse_problem((1, 6, 64, 64, 1), "fp16").shape == (1, 6, 64, 64, 1)  # multi-query
    for bad, says in (("2,32,1000,128,5", "do not divide 32 query heads"), ("2,32,1000,128,0", "positive"),
                      ("2,32,1000,128,8,1", "B,H,S,D,HKV")):
        with pytest.raises(TemplateError, match=says):
            FAMILY.parse_problem(bad, "bf16")
    shapes = FAMILY.input_shapes(gqa)
    assert shapes["q"][0] == (2, 32, 1000, 128) and shapes["k"][0] == shapes["v"][0] == (2, 8, 1000, 128)
    assert FAMILY.outputs(gqa)[0].shape == (2, 32, 1000, 128)
    assert FAMILY.min_bytes(gqa) == 2 * (2 * 2 * 32 * 1000 * 128 + 2 * 2 * 8 * 1000 * 128)
    assert FAMILY.flops(gqa) == FAMILY.flops(FAMILY.parse_problem("2,32,1000,128", "bf16", {"causal": True}))


def test_grouped_query_launches_pass_the_group_and_map_kv_heads():
    problem = FAMILY.parse_problem("3,12,4097,128,4", "bf16", {"causal": True})
    params = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=176, STAGES=2, SMEM_LAYOUT="swizzle",
                  WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1)
    launch = FAMILY.launch(params, problem)
    assert [a.value for a in launch.args[5:8]] == [4097, 36, 3]
    assert [a.value.dims[2] for a in launch.args[:4]] == [36, 12, 12, 36]  # q, k, v, o: B*H, B*HKV
    cp_async = FAMILY.launch(dict(FAMILY.default_params()), problem)
    assert cp_async.grid[1:] == (12, 3) and cp_async.args[5].value == 3


def test_grouped_query_reference_reads_each_query_heads_kv_head():
    problem = FAMILY.parse_problem("1,4,40,64,2", "fp16", {"causal": False})
    ins = FAMILY.inputs(problem, 3)
    assert ins["k"].shape == (1, 2, 40, 64) and ins["q"].shape == (1, 4, 40, 64)
    from templates.attention.problem import from_bits, reference_rows

    for b, h, rows, ref in FAMILY.reference(problem, ins):
        q = from_bits(ins["q"][b, h], "fp16")
        k, v = (from_bits(ins[n][b, h // 2], "fp16") for n in ("k", "v"))
        assert np.allclose(ref, reference_rows(q, k, v, rows, False))
        wrong = (from_bits(ins[n][b, 1 - h // 2], "fp16") for n in ("k", "v"))
        assert not np.allclose(ref, reference_rows(q, *wrong, rows, False))


def test_distance_counts_the_group_and_the_source_is_shared():
    mha = FAMILY.parse_problem("1,32,4096,128", "bf16", {"causal": True})
    gqa = FAMILY.parse_problem("1,32,4096,128,8", "bf16", {"causal": True})
    assert FAMILY.distance(mha, gqa) == pytest.approx(2.0)  # log2 of 4 query heads a KV head
    assert FAMILY.distance(gqa, FAMILY.parse_problem("1,32,2048,128,8", "bf16", {"causal": True})) == 1.0
    assert FAMILY.distance(gqa, FAMILY.parse_problem("1,32,4096,64,8", "bf16", {"causal": True})) == math.inf
    params = FAMILY.default_params()
    assert FAMILY.render(params, mha) == FAMILY.render(params, gqa)


@pytest.mark.parametrize("shape", ["2,3,1000,96", "1,2,4097,256", "2,8,65,96,2", "1,4,4097,256,1"])
def test_head_dims_96_and_256_parse(shape):
    problem = FAMILY.parse_problem(shape, "bf16", {"causal": True})
    assert problem.shape[3] in (96, 256) and attn.HEAD_DIMS == (64, 96, 128, 256)
    with pytest.raises(TemplateError, match=r"D=80: attention supports \[64, 96, 128, 256\]"):
        FAMILY.parse_problem(shape.replace(f",{problem.shape[3]}", ",80", 1), "bf16")


def test_d96_is_held_in_whole_swizzle_atoms_and_d256_in_four():
    tma = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=128, STAGES=2, SMEM_LAYOUT="swizzle",
               WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24)
    sync = dict(FAMILY.default_params(), SMEM_LAYOUT="pad8")
    assert [space.padded_dim(d) for d in attn.HEAD_DIMS] == [64, 128, 128, 256]
    # wgmma's P V takes N = 128 at D=96: its tiles and registers are D=128's; mma.sync keeps 96
    assert space.smem_bytes(tma, 96) == space.smem_bytes(tma, 128)
    assert space.fragment_registers(tma, 96) == space.fragment_registers(tma, 128)
    assert space.acc_dim(sync, 96) == 96 and space.row_stride(sync, 96) == 104
    assert space.row_stride(dict(sync, SMEM_LAYOUT="swizzle"), 96) == 128
    d96 = FAMILY.render(tma, WIDE[0])
    assert "#define D 96\n" in d96 and "#define D_PAD 128 " in d96 and "m64n128k16" in d96
    d256 = FAMILY.render(dict(tma, BLOCK_N=64), WIDE[2])
    assert "#define D_PAD 256 " in d256 and "m64n256k16" in d256
    # the maps: {D, S, B*H}, 64-column boxes (D=96: the second half past D, zero-filled, clipped)
    maps = [a.value for a in FAMILY.launch(tma, WIDE[0]).args if a.kind == "tensormap"]
    assert [(m.dims, m.strides, m.box) for m in maps][0] == ((96, 1000, 6), (192, 192 * 1000), (64, 128, 1))
    maps = [a.value for a in FAMILY.launch(dict(tma, BLOCK_N=64), WIDE[2]).args if a.kind == "tensormap"]
    assert [m.box for m in maps] == [(64, 128, 1), (64, 64, 1), (64, 64, 1), (64, 64, 1)]


@pytest.mark.parametrize("problem", WIDE, ids=lambda p: p.key)
def test_every_path_holds_configs_at_d96_and_d256_and_a_sample_renders(problem):
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    by_path = {path: [c for c in valid if (c["LOADS"], c["MMA"]) == path] for path in PATHS}
    assert all(by_path.values()), {path: len(configs) for path, configs in by_path.items()}
    rng = random.Random(problem.shape[3])
    for config in rng.sample(valid, 150):
        _assert_renders(config, problem)


def test_d256_refusals_name_their_reason():
    problem = WIDE[3]  # 2x3x1000x256 bf16 causal
    tma = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=64, STAGES=2, SMEM_LAYOUT="swizzle",
               WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1)
    assert FAMILY.check(tma, problem, H100_LIMITS) is None
    # Q's 64 KB and two stages of 96 keys: 256 KB
    assert FAMILY.check(dict(tma, BLOCK_N=96), problem, H100_LIMITS).startswith("shared memory")
    # the overlap at 56 registers for the producer: 192 + 40 kept free > 224 (ptxas spilled)
    assert FAMILY.check(dict(tma, PRODUCER_REGS=56), problem, H100_LIMITS).startswith("registers")
    assert FAMILY.check(dict(tma, PRODUCER_REGS=56, INTRA_OVERLAP=0), problem, H100_LIMITS) is None
    one = dict(tma, BLOCK_M=64, NUM_WARPS=4)
    assert FAMILY.check(dict(one, BLOCK_N=96), problem, H100_LIMITS).startswith("registers")
    assert FAMILY.check(dict(one, SCHEDULE="persistent", EPILOGUE="tma"), problem, H100_LIMITS).startswith("registers")
    assert FAMILY.check(dict(one, SCHEDULE="persistent"), problem, H100_LIMITS) is None
    # the cp.async paths: mma.sync on swizzled tiles, and nine warps' register share (168)
    sync = dict(FAMILY.default_params(), BLOCK_N=64, SMEM_LAYOUT="pad8", Q_IN_REGS=0)
    assert FAMILY.check(sync, problem, H100_LIMITS) is None
    assert FAMILY.check(dict(sync, Q_IN_REGS=1), problem, H100_LIMITS).startswith("registers")  # 160 + 64
    assert "swizzled" in FAMILY.check(dict(sync, SMEM_LAYOUT="swizzle"), problem, H100_LIMITS)
    wide = dict(sync, BLOCK_M=128, NUM_WARPS=8, BLOCK_N=64, STAGES=2, SMEM_LAYOUT="swizzle",
                MMA="wgmma")
    assert FAMILY.check(wide, problem, H100_LIMITS) is None
    assert space.allocated_registers(dict(wide, WARP_SPECIALIZED=1)) == 168
    assert "288 threads" in FAMILY.check(dict(wide, WARP_SPECIALIZED=1), problem, H100_LIMITS)
    assert FAMILY.check(dict(wide, BLOCK_N=128, STAGES=1), problem, H100_LIMITS).startswith("registers")  # 64 + 128 + 32
    rejected = [FAMILY.check(c, problem, H100_LIMITS) for c in space.candidates()]
    assert all(r is None or r.split(":")[0] in REASONS for r in rejected)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("problem", WIDE, ids=lambda p: p.key)
def test_d96_and_d256_compile_for_sm90a_on_every_path_without_spills(problem, tmp_path):
    """Two random configs of each path and the starting points: ptxas keeps them out of local
    memory (the space's D=256 and D=96 rules came from its reports of every config)."""
    from workers.results import CompileRequest

    rng = random.Random(problem.shape[3] * 2 + problem.flag("causal"))
    valid = FAMILY.valid_configs(problem, H100_LIMITS)
    sample = [c for path in PATHS for c in rng.sample([c for c in valid if (c["LOADS"], c["MMA"]) == path], 2)]
    sample += FAMILY.starting_points(problem, H100_LIMITS)
    requests = [CompileRequest(FAMILY.render(p, problem), "attention_fwd", FAMILY.compile_options(p, problem))
                for p in sample]
    for params, binary in zip(sample, cores.compile_each(requests, tmp_path)):
        resources = binary.resources
        assert resources.spill_stores == resources.spill_loads == resources.stack_bytes == 0, params


@pytest.mark.parametrize("problem", WIDE, ids=lambda p: p.key)
def test_starting_points_at_d96_and_d256_are_valid_and_lead_with_the_tma_path(problem):
    points = FAMILY.starting_points(problem, H100_LIMITS)
    assert points and all(FAMILY.check(p, problem, H100_LIMITS) is None for p in points)
    assert {(p["LOADS"], p["MMA"]) for p in points} == set(PATHS)
    lead = points[0]  # fewer 128-row tiles than SMs: at D=256 causal one consumer warpgroup of 64 rows
    few_tiles_lead = (64, 64, 1, 0) if problem.flag("causal") else (128, 80, 1, 0)
    assert lead["LOADS"] == "tma" and (lead["BLOCK_M"], lead["BLOCK_N"], lead["INTRA_OVERLAP"], lead["PINGPONG"]) == (
        (128, 160, 1, 1) if problem.shape[3] == 96 else few_tiles_lead)
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)
    many = FAMILY.parse_problem(f"4,8,4096,{problem.shape[3]}", problem.dtype, dict(problem.flags))
    lead = FAMILY.starting_points(many, H100_LIMITS)[0]  # 256 tiles: two warpgroups of 128 rows
    assert (lead["BLOCK_M"], lead["BLOCK_N"], lead["INTRA_OVERLAP"], lead["PINGPONG"]) == (
        (128, 160, 1, 1) if problem.shape[3] == 96 else (128, 80, 1, 0))


def test_validate_checks_d96_and_d256_outputs():
    for problem in (WIDE[1], FAMILY.parse_problem("1,2,300,256", "fp16")):
        inputs = FAMILY.inputs(problem, seed=3)
        good = _exact_output(problem, inputs)
        assert FAMILY.validate(problem, inputs, {"o": good}).ok
        wrong = good.copy()
        wrong[..., -1] = attn.to_bits(np.ones(wrong.shape[:-1], np.float32), problem.dtype)  # O's last column
        assert not FAMILY.validate(problem, inputs, {"o": wrong}).ok


def test_d96_tma_configs_keep_registers_free_where_ptxas_spilled():
    """D=96 holds D=128's fragments, and is refused, with the registers named, where ptxas spilled
    at D=96 (PADDED_* in space.py)."""
    d96, d128 = (FAMILY.parse_problem(f"2,3,1000,{d}", "bf16", {"causal": True}) for d in (96, 128))
    tma = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=160, STAGES=2, SMEM_LAYOUT="swizzle",
               WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1, PINGPONG=1)
    three = dict(tma, BLOCK_M=192, NUM_WARPS=12, BLOCK_N=64, PINGPONG=0)
    store = dict(tma, PRODUCER_REGS=56, EPILOGUE="tma")
    for config in (tma, dict(tma, BLOCK_N=176), three, store):
        assert FAMILY.check(config, d128, H100_LIMITS) is None, config
    assert FAMILY.check(tma, d96, H100_LIMITS) is None and FAMILY.check(dict(tma, BLOCK_N=176), d96, H100_LIMITS) is None
    assert FAMILY.check(three, d96, H100_LIMITS) == \
        "registers: 128 fragment registers (+40 kept free) per consumer thread > 160"
    assert FAMILY.check(store, d96, H100_LIMITS) == "registers: 224 fragment registers (+24 kept free) per consumer thread > 224"
    assert FAMILY.check(dict(three, INTRA_OVERLAP=0), d96, H100_LIMITS) is None
