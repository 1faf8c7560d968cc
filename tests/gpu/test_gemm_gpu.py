"""The GEMM family on a real GPU: random configs of every layout and epilogue against the
float64 reference, on odd M, N and K (tails of every tile, rows not 16-byte aligned).

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpu_checks import failed_checks
from templates import get_family
from workers.compile import compile_cubin
from workers.results import CompileRequest
from workers.timing_options import TimingOptions

pytestmark = pytest.mark.gpu

FAMILY = get_family("gemm")
# (M, N, K, dtype, layout, epilogue): every layout and epilogue in both types; single rows,
# columns and depths; sizes one past a tile; leading dimensions odd (plain loads) and multiples
# of 8 (cp.async), and mixed.
CASES = (
    ("1,17,1000", "fp16", "nn", "none"),
    ("17,1000,4097", "bf16", "nt", "bias"),
    ("1000,4097,17", "fp16", "tn", "bias_relu"),
    ("4097,1000,1", "bf16", "tt", "bias_gelu"),
    ("1000,1000,1000", "fp16", "nt", "bias_gelu"),
    ("1000,1000,1000", "bf16", "tt", "none"),
    ("2048,2048,2048", "bf16", "nn", "bias_relu"),
    ("4097,4096,4096", "fp16", "tn", "bias"),
    ("64,4096,4103", "bf16", "nt", "none"),
    ("333,255,129", "fp16", "tt", "bias_relu"),
    ("129,333,255", "bf16", "nn", "bias_gelu"),
    ("255,129,333", "fp16", "nt", "none"),
    ("1000,4097,1000", "bf16", "tn", "bias_gelu_tanh"),
    ("333,129,255", "fp16", "nn", "bias_gelu_tanh"),
)


def _problems(cases):
    return [FAMILY.parse_problem(shape, dtype, {"layout": layout, "epilogue": epilogue})
            for shape, dtype, layout, epilogue in cases]


PROBLEMS = _problems(CASES)


@pytest.fixture(scope="module")
def bench():
    from workers.gpu import GpuBench

    gpu = GpuBench(0)
    yield gpu
    gpu.close()


def _limits(bench):
    return bench.device_info().limits


def _accepted(cases, configs, limits):
    """(problem, params) of each problem of ``cases`` and each of ``configs`` the family accepts there."""
    return [(problem, params) for problem in _problems(cases) for params in configs
            if FAMILY.check(params, problem, limits) is None]


def _compiled(jobs, cache):
    """(problem, params, binary) of each (problem, params) job, compiled in parallel on the CPUs."""
    def build(job):
        problem, params = job
        request = CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
        return problem, params, compile_cubin(request, cache_dir=cache)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(build, jobs))


@pytest.fixture(scope="module")
def sample(bench, tmp_path_factory):
    """Per problem its first starting point, three random valid configs, and the valid config of
    most fragment registers (the heaviest tile it allows)."""
    from templates.gemm import space

    rng = random.Random(2027)
    limits = _limits(bench)
    jobs = []
    for problem in PROBLEMS:
        valid = FAMILY.valid_configs(problem, limits)
        starts = FAMILY.starting_points(problem, limits)[:1]
        heaviest = max(valid, key=lambda c: (space.fragment_registers(c), c["BLOCK_K"], c["STAGES"]))
        jobs += [(problem, params) for params in starts + rng.sample(valid, min(3, len(valid))) + [heaviest]]
    return _compiled(jobs, tmp_path_factory.mktemp("cubins"))


def test_random_configs_match_the_reference_on_every_tail(bench, sample):
    failures = []
    for problem, params, binary in sample:
        assert binary.resources.stack_bytes == 0 and binary.resources.spill_stores == 0, params
        result = bench.measure(binary, FAMILY.launch(params, problem), "gemm", problem, seed=11, timing=TimingOptions(min_reps=3, max_reps=5, target_ms=10))
        if not result.ok:
            failures.append(f"{problem.key} {params}: {result.failure} {result.reason}")
            continue
        assert result.error is not None and result.error < 0.03
        assert result.timing.median_ms > 0
    assert not failures, "\n".join(failures)


def test_every_group_order_and_smem_layout_matches_the_reference(bench, tmp_path_factory):
    """One tile, each GROUP_M and SMEM_LAYOUT, on a problem of several tile rows and columns whose
    tile rows do not divide into groups (1000 / 64 = 16 tile rows, 15.6 columns)."""
    problem = FAMILY.parse_problem("1000,1000,136", "bf16", {"layout": "tn", "epilogue": "bias"})
    base = dict(FAMILY.default_params(), BLOCK_M=64, BLOCK_N=64, NUM_WARPS=4)
    jobs = [(problem, dict(base, GROUP_M=g, SMEM_LAYOUT=layout, STAGES=stages))
            for g in (1, 4, 8, 16) for layout in ("swizzle", "pad8") for stages in (2, 4)]
    failures = failed_checks(bench, FAMILY, _compiled(jobs, tmp_path_factory.mktemp("group_cubins")), seed=5,
                             target_ms=5, no_spills=False)
    assert not failures, "\n".join(failures)


def test_a_wrong_kernel_is_caught(bench, tmp_path_factory):
    """A kernel rendered for B row-major fails validation on the problem whose B is transposed
    (a square problem: the launch is the same)."""
    problem = FAMILY.parse_problem("512,512,512", "fp16", {"layout": "nt"})
    other = FAMILY.parse_problem("512,512,512", "fp16", {"layout": "nn"})
    params = FAMILY.default_params()
    wrong = compile_cubin(CompileRequest(FAMILY.render(params, other), "gemm", FAMILY.compile_options(params, other)),
                          cache_dir=tmp_path_factory.mktemp("wrong"))
    result = bench.measure(wrong, FAMILY.launch(params, problem), "gemm", problem, seed=5, timing=TimingOptions(min_reps=3, max_reps=5))
    assert not result.ok and result.failure == "wrong", result


def test_the_default_config_reaches_a_fair_rate_on_a_square_problem(bench, tmp_path_factory):
    """Not a benchmark: a sanity floor (an H100 or H200 runs the 128 x 128 x 32 mma.sync tile at
    several hundred TFLOPS; a tenth of that means something is badly off)."""
    problem = FAMILY.parse_problem("4096,4096,4096", "fp16", {"layout": "nt"})
    params = FAMILY.default_params()
    binary = compile_cubin(CompileRequest(FAMILY.render(params, problem), "gemm",
                                          FAMILY.compile_options(params, problem)),
                           cache_dir=tmp_path_factory.mktemp("rate"))
    result = bench.measure(binary, FAMILY.launch(params, problem), "gemm", problem, seed=1, timing=TimingOptions(min_reps=10))
    assert result.ok, result
    assert FAMILY.tflops(problem, result.timing.median_ms) > 50


# The wgmma path (TMA into mbarrier stages, a producer warpgroup, wgmma from shared memory): odd
# M, N, K whose stored rows are 16-byte aligned (what its tensor maps need), every layout.
WGMMA_CASES = (
    ("8,8,8", "fp16", "nn", "none"),
    ("1,264,72", "bf16", "nt", "bias"),
    ("129,255,64", "bf16", "nt", "bias_gelu"),
    ("136,264,72", "fp16", "tn", "bias_relu"),
    ("1000,1000,1000", "bf16", "tt", "bias_gelu"),
    ("4104,1000,520", "fp16", "tt", "none"),
    ("1000,4104,520", "bf16", "nn", "bias"),
    ("129,255,64", "fp16", "nt", "bias_gelu_tanh"),
    ("1000,1000,1000", "bf16", "nn", "bias_gelu_tanh"),
)
# (BLOCK_M, BLOCK_N, NUM_WARPS: 4 a consumer warpgroup, STAGES, PRODUCER_REGS, PERSISTENT, SPLIT_K,
# CLUSTER_M): plain tiles, then K in parts (two blocks an SM, and persistent), persistent blocks,
# clusters of two sharing B (with split-K and persistent too), then 192 and 224 columns.
WGMMA_TILES = ((128, 256, 8, 4, 40, 0, 1, 1), (256, 128, 8, 3, 24, 0, 1, 1), (128, 128, 4, 4, 40, 0, 1, 1),
               (64, 128, 4, 2, 0, 0, 1, 1), (64, 64, 4, 4, 0, 0, 1, 1),
               (64, 128, 4, 4, 0, 0, 4, 1), (64, 64, 4, 4, 0, 1, 8, 1), (128, 128, 8, 4, 40, 0, 2, 1),
               (128, 256, 8, 4, 40, 1, 1, 1), (64, 128, 4, 4, 0, 1, 1, 1),
               (128, 256, 8, 4, 40, 0, 1, 2), (128, 128, 8, 4, 40, 1, 1, 2), (64, 128, 4, 4, 0, 0, 4, 2),
               (128, 224, 8, 4, 40, 1, 1, 1), (128, 192, 8, 4, 40, 0, 1, 2), (64, 192, 4, 6, 0, 0, 4, 1))


def test_the_wgmma_path_matches_the_reference_on_every_layout_and_tail(bench, tmp_path_factory):
    configs = [dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=64, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps,
                    STAGES=stages, PRODUCER_REGS=regs, GROUP_M=1 if bm == 256 else 8, PERSISTENT=persistent,
                    SPLIT_K=split, CLUSTER_M=cluster)
               for bm, bn, warps, stages, regs, persistent, split, cluster in WGMMA_TILES]
    jobs = _accepted(WGMMA_CASES, configs, _limits(bench))
    assert len(jobs) >= 40 and {p.flag("layout") for p, _ in jobs} == {"nn", "nt", "tn", "tt"}
    for name, more in (("PERSISTENT", 0), ("SPLIT_K", 1), ("CLUSTER_M", 1)):
        assert sum(params[name] > more for _, params in jobs) >= 4, name
    failures = failed_checks(bench, FAMILY, _compiled(jobs, tmp_path_factory.mktemp("wgmma_cubins")), seed=3,
                             target_ms=5)
    assert not failures, "\n".join(failures)


# Ping-pong (PINGPONG=1): more work units than multiprocessors, blocks of odd and even unit
# counts, K of one stage, of fewer stages than the pipeline holds (both warpgroups' stages in flight
# at once) and of many; every layout and epilogue.
PINGPONG_CASES = (
    ("2048,2048,520", "fp16", "nt", "bias_gelu_tanh"),
    ("1000,4104,4096", "bf16", "nn", "bias"),
    ("4104,1000,128", "fp16", "tn", "bias_relu"),
    ("2056,2056,1000", "bf16", "tt", "bias_gelu"),
    ("8192,1024,64", "fp16", "nt", "none"),
    ("3001,2048,2048", "bf16", "nt", "bias_gelu_tanh"),
)
# (BLOCK_M, BLOCK_N, STAGES, PRODUCER_REGS, CLUSTER_M, C_STORE)
PINGPONG_TILES = ((128, 128, 4, 40, 1, "tma"), (128, 128, 6, 40, 2, "direct"), (64, 256, 4, 40, 1, "tma"),
                  (64, 128, 8, 0, 1, "direct"), (128, 64, 6, 0, 2, "tma"), (64, 192, 4, 40, 1, "direct"))


def test_pingpong_warpgroups_match_the_reference(bench, tmp_path_factory):
    configs = [dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=64, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=8,
                    STAGES=stages, PRODUCER_REGS=regs, PERSISTENT=1, CLUSTER_M=cluster, C_STORE=c_store, PINGPONG=1)
               for bm, bn, stages, regs, cluster, c_store in PINGPONG_TILES]
    jobs = _accepted(PINGPONG_CASES, configs, _limits(bench))
    assert len(jobs) >= 24 and {p.flag("layout") for p, _ in jobs} == {"nn", "nt", "tn", "tt"}
    assert sum(params["CLUSTER_M"] > 1 for _, params in jobs) >= 4
    failures = failed_checks(bench, FAMILY, _compiled(jobs, tmp_path_factory.mktemp("pingpong_cubins")), seed=13,
                             target_ms=5)
    assert not failures, "\n".join(failures)


# SWAP_AB (A's rows as the MMA's N; M <= 256, A row-major): (BLOCK_M, BLOCK_N, NUM_WARPS, STAGES,
# PRODUCER_REGS, PERSISTENT, SPLIT_K): 16-128 rows of A, one and two consumer warpgroups, deep
# pipelines, K in parts, persistent blocks.
SWAP_CASES = (
    ("1,264,72", "bf16", "nt", "bias"),
    ("17,1000,1000", "fp16", "nn", "bias_gelu"),
    ("33,4104,520", "bf16", "nt", "bias_relu"),
    ("129,255,64", "fp16", "nt", "none"),
    ("250,136,3000", "bf16", "nn", "none"),
    ("16,4096,14336", "bf16", "nt", "none"),
    ("17,1000,1000", "bf16", "nt", "bias_gelu_tanh"),
)
SWAP_TILES = ((16, 64, 4, 12, 0, 0, 1), (16, 128, 4, 8, 0, 0, 4), (32, 64, 4, 16, 0, 0, 1), (64, 128, 8, 6, 40, 0, 2),
              (128, 64, 4, 8, 0, 0, 1), (16, 64, 4, 8, 40, 1, 8), (32, 256, 8, 4, 40, 1, 1))


def test_swapped_operands_match_the_reference_on_small_m(bench, tmp_path_factory):
    configs = [dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=64, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps,
                    STAGES=stages, PRODUCER_REGS=regs, PERSISTENT=persistent, SPLIT_K=split, SWAP_AB=1)
               for bm, bn, warps, stages, regs, persistent, split in SWAP_TILES]
    jobs = _accepted(SWAP_CASES, configs, _limits(bench))
    assert len(jobs) >= 20 and {p.flag("layout") for p, _ in jobs} == {"nn", "nt"}
    for name, more in (("PERSISTENT", 0), ("SPLIT_K", 1)):
        assert sum(params[name] > more for _, params in jobs) >= 2, name
    failures = failed_checks(bench, FAMILY, _compiled(jobs, tmp_path_factory.mktemp("swap_cubins")), seed=5,
                             target_ms=5)
    assert not failures, "\n".join(failures)


def test_the_peers_of_gelu_tanh_pass_the_familys_check(monkeypatch):
    """cuBLASLt's fused bias + GELU (torch._addmm_activation) and the Triton peer's tanh form each
    pass the family's check against the float64 tanh reference, as bias_gelu's peers do against
    the erf reference (one tolerance for both), and cuBLASLt's fused bias + ReLU against ReLU's."""
    pytest.importorskip("torch")
    from templates.gemm import triton_peer
    from templates.gemm.problem import tolerance
    from workers.peers import time_peers

    monkeypatch.setattr(triton_peer, "CONFIG_SPACE", ((128, 128, 32, 4, 4),))  # one config: no long tuning
    names = ("cublas", "triton") if triton_peer.available() else ("cublas",)
    for epilogue in ("bias_gelu_tanh", "bias_gelu", "bias_relu"):
        problem = FAMILY.parse_problem("1000,1000,1000", "bf16", {"layout": "nt", "epilogue": epilogue})
        found = time_peers("gemm", problem, reps=5, cross_check=False)
        for name in names:
            result = found[name]
            assert result.median_ms is not None and not result.note.startswith("wrong"), (epilogue, result)
            assert result.error is not None and result.error <= tolerance(problem), (epilogue, result)
        assert ("_addmm_activation" in found["cublas"].note) == (epilogue != "bias_gelu")  # cuBLASLt's fused


# e4m3 (layout nt, K a multiple of 16), per-tensor and block scales, bf16 and fp16 out: sizes off
# every tile (M and N odd or one past a tile, K not a multiple of 128: a scale block cut short);
# K blocks even and odd past the first steps (the two-set loop takes two a step, an odd count's
# last block after it).
FP8_CASES = (
    ("1000,264,1008", "tensor", "bf16", "bias_gelu"),
    ("300,520,1360", "tensor", "bf16", "none"),
    ("257,384,1744", "block", "fp16", "bias"),
    ("1000,264,1008", "block", "fp16", "bias_relu"),
    ("4097,4096,4096", "tensor", "fp16", "bias"),
    ("4097,4096,4096", "block", "bf16", "none"),
    ("129,255,272", "block", "bf16", "bias_gelu_tanh"),
    ("17,1000,1008", "tensor", "bf16", "bias"),
    ("64,4104,14336", "block", "bf16", "none"),
)
# (BLOCK_M, BLOCK_N, NUM_WARPS, STAGES, PRODUCER_REGS, PERSISTENT, SPLIT_K, CLUSTER_M, C_STORE, SWAP_AB)
FP8_TILES = ((128, 128, 8, 4, 40, 0, 1, 1, "direct", 0), (128, 128, 8, 6, 40, 0, 1, 1, "tma", 0),
             (64, 128, 4, 4, 40, 0, 1, 1, "direct", 0), (64, 64, 4, 6, 0, 0, 1, 1, "direct", 0),
             (128, 128, 8, 4, 40, 1, 1, 1, "direct", 0), (128, 128, 8, 4, 40, 0, 1, 2, "direct", 0),
             (128, 128, 8, 4, 40, 1, 1, 1, "tma", 0), (64, 128, 4, 4, 40, 0, 4, 1, "direct", 0),
             (64, 64, 4, 4, 0, 0, 2, 1, "direct", 0), (128, 64, 8, 4, 40, 1, 1, 2, "tma", 0),
             (16, 64, 4, 8, 0, 0, 1, 1, "direct", 1), (32, 128, 4, 8, 0, 0, 4, 1, "direct", 1),
             (128, 192, 8, 4, 40, 1, 1, 1, "tma", 0), (64, 192, 4, 4, 24, 0, 1, 1, "direct", 0))
# ping-pong's, 64 or 96 accumulators a thread in each set: (BLOCK_M, BLOCK_N, STAGES, CLUSTER_M, C_STORE)
FP8_PINGPONG_TILES = ((128, 64, 6, 1, "tma"), (64, 128, 6, 2, "direct"), (64, 192, 4, 1, "tma"))


def _fp8_problems():
    return [_fp8_problem(*case) for case in FP8_CASES]


def _fp8_problem(shape, scale, out, epilogue):
    return FAMILY.parse_problem(shape, "e4m3", {"layout": "nt", "scale": scale, "out_dtype": out, "epilogue": epilogue})


def test_e4m3_matches_the_reference_per_tensor_and_per_block(bench, tmp_path_factory):
    configs = [dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=128, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps,
                    STAGES=stages, PRODUCER_REGS=regs, PERSISTENT=persistent, SPLIT_K=split, CLUSTER_M=cluster,
                    C_STORE=c_store, SWAP_AB=swap)
               for bm, bn, warps, stages, regs, persistent, split, cluster, c_store, swap in FP8_TILES]
    configs += [dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=128, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=8,
                     STAGES=stages, PRODUCER_REGS=40, PERSISTENT=1, CLUSTER_M=cluster, C_STORE=c_store, PINGPONG=1)
                for bm, bn, stages, cluster, c_store in FP8_PINGPONG_TILES]
    limits = _limits(bench)
    jobs = [(problem, params) for problem in _fp8_problems() for params in configs
            if FAMILY.check(params, problem, limits) is None]
    scales = [p.flag("scale") for p, _ in jobs]
    assert scales.count("tensor") >= 20 and scales.count("block") >= 20
    for name, more in (("PERSISTENT", 0), ("SPLIT_K", 1), ("CLUSTER_M", 1), ("SWAP_AB", 0), ("PINGPONG", 0)):
        assert sum(params[name] > more for _, params in jobs) >= 2, name
    failures = failed_checks(bench, FAMILY, _compiled(jobs, tmp_path_factory.mktemp("fp8_cubins")), seed=7,
                             target_ms=5)
    assert not failures, "\n".join(failures)


def test_e4m3_random_configs_match_the_reference(bench, tmp_path_factory):
    rng = random.Random(2028)
    limits = _limits(bench)
    jobs = []
    for problem in _fp8_problems():
        valid = FAMILY.valid_configs(problem, limits)
        jobs += [(problem, params) for params in rng.sample(valid, min(4, len(valid)))]
    failures = failed_checks(bench, FAMILY, _compiled(jobs, tmp_path_factory.mktemp("fp8_random")), seed=9,
                             target_ms=5)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("shape, scale, out, epilogue", [
    ("1000,272,1008", "tensor", "bf16", "bias_gelu"), ("4096,4096,4096", "tensor", "fp16", "none"),
    ("1000,264,1008", "block", "bf16", "bias"), ("4097,4096,4096", "block", "fp16", "bias_gelu_tanh"),
])
def test_the_e4m3_peers_pass_the_familys_check(shape, scale, out, epilogue, monkeypatch):
    """Per tensor cuBLASLt (torch._scaled_mm), per block our Triton FP8 kernel, each against the
    float64 reference from the dequantized inputs; the other refused with its reason."""
    pytest.importorskip("torch")
    from templates.gemm import triton_peer
    from templates.gemm.problem import tolerance
    from workers.peers import time_peers

    monkeypatch.setattr(triton_peer, "FP8_CONFIG_SPACE", ((128, 128, 128, 3, 8), (64, 64, 64, 4, 4)))
    problem = _fp8_problem(shape, scale, out, epilogue)
    found = time_peers("gemm", problem, reps=5, cross_check=False)
    ran = "cublas" if scale == "tensor" else "triton"
    if ran == "triton" and not triton_peer.available():
        pytest.skip("Triton is not installed")
    result = found[ran]
    assert result.median_ms is not None and not result.note.startswith("wrong"), result
    assert result.error is not None and result.error <= tolerance(problem), result
    other = found["triton" if ran == "cublas" else "cublas"]
    assert other.median_ms is None and other.note


def test_an_e4m3_kernel_that_ignores_the_block_scales_is_caught(bench, tmp_path_factory):
    """The per-tensor kernel (scale_a[0] scale_b[0] for every block) launched on a block-scaled
    problem (the same arguments) fails validation: the inputs' block scales differ."""
    problem = _fp8_problem("1000,264,1008", "block", "bf16", "none")
    tensor = _fp8_problem("1000,264,1008", "tensor", "bf16", "none")
    params = dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=128, BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8,
                  STAGES=4, PRODUCER_REGS=40)
    assert FAMILY.check(params, problem, _limits(bench)) is None
    wrong = compile_cubin(CompileRequest(FAMILY.render(params, tensor), "gemm", FAMILY.compile_options(params, tensor)),
                          cache_dir=tmp_path_factory.mktemp("fp8_wrong"))
    result = bench.measure(wrong, FAMILY.launch(params, problem), "gemm", problem, seed=5,
                           timing=TimingOptions(min_reps=3, max_reps=5))
    assert not result.ok and result.failure == "wrong", result
