"""The attention family on a real GPU: random configs against the float64 reference.

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

FAMILY = get_family("attention")
PROBLEMS = [
    FAMILY.parse_problem(f"2,3,{seq},{d}", dtype, {"causal": causal})
    for seq in (1000, 4097)
    for d in (64, 128)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]


@pytest.fixture(scope="module")
def bench():
    from workers.gpu import GpuBench

    gpu = GpuBench(0)
    yield gpu
    gpu.close()


@pytest.fixture(scope="module")
def sample(bench, tmp_path_factory):
    """Two random configs of the cp.async paths and two of their wgmma path per problem, compiled in
    parallel on the CPUs (the TMA path has its own sample, ``tma_sample``)."""
    rng = random.Random(2026)
    limits = _limits(bench)
    jobs = []
    for problem in PROBLEMS:
        valid = FAMILY.valid_configs(problem, limits)
        jobs += [(problem, params) for params in rng.sample([c for c in valid if c["LOADS"] == "cp.async"], 2)]
        # and two of the wgmma path, whatever the draw gave
        jobs += [(problem, params) for params in rng.sample([c for c in valid if c["MMA"] == "wgmma"
                                                             and c["LOADS"] == "cp.async"], 2)]
    return _compiled(jobs, tmp_path_factory.mktemp("cubins"))


def _compiled(jobs, cache):
    """(problem, params, binary) of each (problem, params) job, compiled in parallel on the CPUs."""
    def build(job):
        problem, params = job
        request = CompileRequest(FAMILY.render(params, problem), "attention_fwd", FAMILY.compile_options(params, problem))
        return problem, params, compile_cubin(request, cache_dir=cache)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(build, jobs))


TMA_PROBLEMS = [
    FAMILY.parse_problem(f"{'1,3' if seq > 2048 else '2,3'},{seq},{d}", dtype, {"causal": causal})
    for seq in (1, 65, 1000, 4097)
    for d in (64, 128)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]
# More tiles than the SMs hold: a persistent block takes several, under both orders.
MANY_TILES = [
    FAMILY.parse_problem(shape.format(d=d), dtype, {"causal": causal})
    for shape in ("8,16,1000,{d}", "3,11,4097,{d}")
    for d in (64, 128)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]


@pytest.fixture(scope="module")
def tma_sample(bench, tmp_path_factory):
    """Per problem, two random configs of the TMA path (LOADS=tma) and its starting points (on the
    problems of many tiles, its starting points)."""
    rng = random.Random(14)
    limits = _limits(bench)
    jobs = []
    for problem in TMA_PROBLEMS:
        valid = [c for c in FAMILY.valid_configs(problem, limits) if c["LOADS"] == "tma"]
        starts = [c for c in FAMILY.starting_points(problem, limits) if c["LOADS"] == "tma"]
        jobs += [(problem, params) for params in rng.sample(valid, 2) + starts]
    for problem in MANY_TILES:
        jobs += [(problem, c) for c in FAMILY.starting_points(problem, limits) if c["LOADS"] == "tma"]
    return _compiled(jobs, tmp_path_factory.mktemp("tma_cubins"))


def test_tma_path_configs_match_the_reference_on_every_tail(bench, tma_sample):
    """S = 1, 65, 1000 and 4097: tails of every tile size, a single row, the causal corner."""
    failures = failed_checks(bench, FAMILY, tma_sample, seed=13, target_ms=10)
    assert not failures, "\n".join(failures)


def _limits(bench):
    return bench.device_info().limits


# Grouped-query and multi-query attention: K and V of fewer heads, at odd sizes.
GQA_PROBLEMS = [
    FAMILY.parse_problem(shape.format(d=d), dtype, {"causal": causal})
    for shape in ("2,6,1000,{d},2", "1,8,4097,{d},1", "3,12,65,{d},4")
    for d in (64, 128)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]


@pytest.fixture(scope="module")
def gqa_sample(bench, tmp_path_factory):
    """Per grouped-query problem: a random config of each path (cp.async, TMA) and the TMA starting
    points."""
    rng = random.Random(96)
    limits = _limits(bench)
    jobs = []
    for problem in GQA_PROBLEMS:
        valid = FAMILY.valid_configs(problem, limits)
        jobs += [(problem, rng.choice([c for c in valid if c["LOADS"] == loads])) for loads in ("cp.async", "tma")]
        jobs += [(problem, c) for c in FAMILY.starting_points(problem, limits) if c["LOADS"] == "tma"]
    return _compiled(jobs, tmp_path_factory.mktemp("gqa_cubins"))


def test_grouped_query_configs_match_the_reference(bench, gqa_sample):
    """Each query head reads its own KV head: a kernel reading another would fail the reference."""
    failures = failed_checks(bench, FAMILY, gqa_sample, seed=17, target_ms=10, no_spills=False)  # random draws may spill
    assert not failures, "\n".join(failures)


def test_random_configs_match_the_reference(bench, sample):
    failures = []
    for problem, params, binary in sample:
        result = bench.measure(binary, FAMILY.launch(params, problem), "attention", problem, seed=11, timing=TimingOptions(min_reps=3, max_reps=5, target_ms=10))
        if not result.ok:
            failures.append(f"{problem.key} {params}: {result.failure} {result.reason}")
            continue
        assert result.error is not None and result.error < 0.03
        assert result.timing.median_ms > 0
    assert not failures, "\n".join(failures)


def test_a_wrong_kernel_is_caught(bench, sample):
    """A kernel rendered for the non-causal problem fails validation on the causal one."""
    problem, params, binary = next(s for s in sample if s[0].flag("causal"))
    other = FAMILY.parse_problem(problem.shape, problem.dtype, {"causal": False})
    wrong = compile_cubin(
        CompileRequest(FAMILY.render(params, other), "attention_fwd", FAMILY.compile_options(params, other))
    )
    result = bench.measure(wrong, FAMILY.launch(params, problem), "attention", problem, seed=5, timing=TimingOptions(min_reps=3, max_reps=5))
    assert not result.ok and result.failure == "wrong", result


def test_a_timing_stops_early_only_when_clearly_behind(bench, sample):
    problem, params, binary = next(s for s in sample if s[0].shape[2] == 4097)
    launch = FAMILY.launch(params, problem)
    full = bench.measure(binary, launch, "attention", problem, seed=2, timing=TimingOptions(min_reps=20))
    assert full.ok and full.timing.repetitions >= 20 and not full.detail
    behind = bench.measure(binary, launch, "attention", problem, seed=2, timing=TimingOptions(min_reps=20, abort_above_ms=full.timing.median_ms / 3))
    assert behind.ok and behind.timing.repetitions == 5 and "stopped early" in behind.detail
    ahead = bench.measure(binary, launch, "attention", problem, seed=2, timing=TimingOptions(min_reps=20, abort_above_ms=full.timing.median_ms * 3))
    assert ahead.ok and ahead.timing.repetitions >= 20 and not ahead.detail


def test_kernel_time_is_measured_and_within_the_workers_time(bench, sample):
    """Every launch of a trial runs between CUDA events (the warm-up too): the kernels' time is
    never more than the worker's, and more than half the warm-up asked for (the warm-up's launch
    count comes from an estimate). The L2 flushes before the timed launches are counted apart:
    each takes some microseconds of GPU time, and none are counted when there is no flush."""
    problem, params, binary = min(sample, key=lambda s: s[0].shape[0] * s[0].shape[1] * s[0].shape[2])
    launch = FAMILY.launch(params, problem)
    m = bench.measure(binary, launch, "attention", problem, seed=3, timing=TimingOptions(warmup_ms=20.0, rep=50))
    assert m.ok and 0.01 < m.kernel_seconds and m.kernel_seconds + m.flush_seconds <= m.gpu_seconds
    assert 50 * 2e-6 < m.flush_seconds < 50 * 1e-3  # 50 flushes of the L2's size, 2 us to 1 ms each
    unflushed = bench.measure(binary, launch, "attention", problem, seed=3, timing=TimingOptions(warmup_ms=5.0, rep=50, flush_l2=False))
    assert unflushed.ok and unflushed.flush_seconds == 0
    spare = len(bench._spare_events)  # the trials' events are kept and reused, not made anew
    again = bench.measure(binary, launch, "attention", problem, seed=3, timing=TimingOptions(warmup_ms=5.0, rep=50))
    assert again.ok and again.flush_seconds > 0 and len(bench._spare_events) == spare > 100


# D=96 (tiles and wgmma's O accumulator padded to 128 columns, the TMA's second box half past D)
# and D=256 (four TMA boxes a row, P V's N of 256): odd sizes, both dtypes, with and without the
# mask, and grouped K and V.
WIDE_PROBLEMS = [
    FAMILY.parse_problem(f"{'1,3' if seq > 2048 else '2,3'},{seq},{d}", dtype, {"causal": causal})
    for seq in (65, 1000, 4097)
    for d in (96, 256)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]
WIDE_GQA = [
    FAMILY.parse_problem(shape.format(d=d), dtype, {"causal": causal})
    for shape in ("2,6,1000,{d},2", "1,8,4097,{d},1", "3,12,65,{d},4")
    for d in (96, 256)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]
PATHS = (("cp.async", "sync"), ("cp.async", "wgmma"), ("tma", "wgmma"))


@pytest.fixture(scope="module")
def wide_sample(bench, tmp_path_factory):
    """Per problem of D 96 or 256: a random config of each path (mma.sync and wgmma on cp.async
    loads, the TMA pipeline), and the starting points of the TMA path and of the others."""
    rng = random.Random(256)
    limits = _limits(bench)
    jobs = []
    for problem in WIDE_PROBLEMS + WIDE_GQA:
        valid = FAMILY.valid_configs(problem, limits)
        for loads, mma in PATHS:
            jobs.append((problem, rng.choice([c for c in valid if (c["LOADS"], c["MMA"]) == (loads, mma)])))
        if problem in WIDE_PROBLEMS:
            jobs += [(problem, c) for c in FAMILY.starting_points(problem, limits)]
    return _compiled(jobs, tmp_path_factory.mktemp("wide_cubins"))


def test_head_dims_96_and_256_match_the_reference_on_every_path(bench, wide_sample):
    """S = 65, 1000 and 4097 at D 96 and 256 on each path, grouped K and V among them (spills
    are checked on the CPU, test_attention.py: here only the outputs)."""
    assert {(p.shape[3], c["LOADS"], c["MMA"]) for p, c, _ in wide_sample} == {
        (d, loads, mma) for d in (96, 256) for loads, mma in PATHS}
    failures = failed_checks(bench, FAMILY, wide_sample, seed=19, target_ms=10, no_spills=False)
    assert not failures, "\n".join(failures)
