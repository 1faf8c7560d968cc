"""Re-timing on a real GPU: three attention kernels timed interleaved, and a wrong one among them.

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import random

import pytest

from templates import get_family
from workers.compile import compile_cubin
from workers.results import CompileRequest
from workers.timing_options import TimingOptions

pytestmark = pytest.mark.gpu

FAMILY = get_family("attention")
PROBLEM = FAMILY.parse_problem("2,8,2048,64", "fp16", {"causal": True})


@pytest.fixture(scope="module")
def bench():
    from workers.gpu import GpuBench

    gpu = GpuBench(0)
    yield gpu
    gpu.close()


def _kernel(params, problem=PROBLEM, cache=None):
    request = CompileRequest(FAMILY.render(params, problem), "attention_fwd",
                             FAMILY.compile_options(params, problem))
    return compile_cubin(request, cache_dir=cache), FAMILY.launch(params, PROBLEM)


@pytest.fixture(scope="module")
def kernels(bench, tmp_path_factory):
    """Three valid configs (one of them wgmma), compiled."""
    info = bench.device_info()
    limits = info.limits
    valid = FAMILY.valid_configs(PROBLEM, limits)
    rng = random.Random(7)
    picked = rng.sample([c for c in valid if c["MMA"] == "sync"], 2)
    picked += rng.sample([c for c in valid if c["MMA"] == "wgmma"], 1)
    cache = tmp_path_factory.mktemp("cubins")
    return [(params, *_kernel(params, cache=cache)) for params in picked]


def test_three_kernels_retimed_interleaved(bench, kernels):
    retiming = bench.retime([(b, launch) for _, b, launch in kernels], "attention", PROBLEM, seed=3)
    assert len(retiming.measurements) == 3 and not retiming.replayed and not bench.dead
    failures = [f"{p}: {m.failure} {m.reason}" for (p, _, _), m in zip(kernels, retiming.measurements)
                if not m.ok]
    assert not failures, failures
    reps = {m.timing.repetitions for m in retiming.measurements}
    assert reps == {retiming.rounds} and 5 <= retiming.rounds <= 30
    for m, (_, binary, _) in zip(retiming.measurements, kernels):
        t = m.timing
        assert 0 < t.min_ms <= t.median_ms <= t.max_ms and t.iqr_ms >= 0
        assert m.error is not None and m.error < 0.03 and m.cubin_hash == binary.cubin_hash
        assert "interleaved with 2 other kernels over" in m.detail
    for clocks in (retiming.clocks_before, retiming.clocks_after):
        assert clocks["sm_mhz"] > 0 and clocks["mem_mhz"] > 0 and "temperature_c" in clocks
    assert retiming.gpu_seconds > retiming.kernel_seconds + retiming.flush_seconds
    assert retiming.flush_seconds > retiming.rounds * 3 * 2e-6  # one flush before every launch
    # the same kernel timed alone comes out near its interleaved median
    params, binary, launch = kernels[0]
    alone = bench.measure(binary, launch, "attention", PROBLEM, seed=3)
    assert alone.ok and 0.7 < retiming.measurements[0].timing.median_ms / alone.timing.median_ms < 1.4


def test_a_wrong_kernel_fails_alone(bench, kernels):
    """A kernel rendered for the non-causal problem is wrong on the causal one: it fails, the
    others are timed as before, each as many times."""
    params, _, launch = kernels[1]
    other = FAMILY.parse_problem(PROBLEM.shape, PROBLEM.dtype, {"causal": False})
    wrong, _ = _kernel(params, problem=other)
    mixed = [(kernels[0][1], kernels[0][2]), (wrong, launch), (kernels[2][1], kernels[2][2])]
    retiming = bench.retime(mixed, "attention", PROBLEM, seed=3, rounds=12)
    first, bad, last = retiming.measurements
    assert bad.failure == "wrong" and not bench.dead
    assert first.ok and last.ok and first.timing.repetitions == last.timing.repetitions == 12
    assert "with 1 other kernel over 12 rounds" in first.detail


def test_a_trial_timed_beside_the_anchor_states_its_ratio_to_it(bench, kernels):
    """``measure(..., timing=TimingOptions(anchor=...))``: the trial verified and timed in turns with the anchor; a
    kernel beside itself comes out at a ratio of 1, another at its own time over the anchor's,
    and a wrong kernel still fails with the anchor beside it."""
    (_, a, launch_a), (_, b, launch_b) = kernels[0], kernels[1]
    itself = bench.measure(a, launch_a, "attention", PROBLEM, seed=3, timing=TimingOptions(anchor=(a, launch_a)))
    assert itself.ok and itself.paired is not None and not bench.dead
    assert itself.paired.ratio == pytest.approx(1.0, abs=0.02)
    assert itself.paired.repetitions == itself.timing.repetitions >= 20
    assert itself.paired.anchor_ms == pytest.approx(itself.timing.median_ms, rel=0.03)
    other = bench.measure(b, launch_b, "attention", PROBLEM, seed=3, timing=TimingOptions(anchor=(a, launch_a)))
    assert other.ok and other.paired is not None and other.paired.ratio_iqr >= 0
    assert other.paired.ratio == pytest.approx(other.timing.median_ms / other.paired.anchor_ms, rel=0.05)
    alone = bench.measure(b, launch_b, "attention", PROBLEM, seed=3)
    assert alone.paired is None and alone.timing.median_ms == pytest.approx(other.timing.median_ms, rel=0.15)
    params = kernels[1][0]
    wrong, _ = _kernel(params, problem=FAMILY.parse_problem(PROBLEM.shape, PROBLEM.dtype, {"causal": False}))
    failed = bench.measure(wrong, launch_b, "attention", PROBLEM, seed=3, timing=TimingOptions(anchor=(a, launch_a)))
    assert failed.failure == "wrong" and failed.paired is None and not bench.dead
