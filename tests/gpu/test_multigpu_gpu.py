"""Which GPU measured a trial, and its clocks around the timing; with two GPUs or more, every GPU
times the incumbent in rounds (the pool's calibrations).

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_multigpu_gpu.py``. Skipped where no GPU
is visible; the pool test where fewer than two are.
"""

from __future__ import annotations

import time

import pytest

from templates import get_family
from workers.compile import compile_cubin
from workers.driver import gpu_count
from workers.results import CompileRequest

pytestmark = pytest.mark.gpu

FAMILY = get_family("attention")
PROBLEM = FAMILY.parse_problem("1,8,512,64", "fp16", {"causal": False})  # 10-15 us kernels


def _config(limits):
    return FAMILY.starting_points(PROBLEM, limits)[0]


def _kernel(params):
    launch = FAMILY.launch(params, PROBLEM)
    source = FAMILY.render(params, PROBLEM)
    return params, source, launch, tuple(FAMILY.compile_options(params, PROBLEM))


def test_a_measurement_names_its_gpu_and_reads_the_clocks_around_its_timing():
    from workers.gpu import GpuBench

    bench = GpuBench(0)
    try:
        info = bench.device_info()
        params, source, launch, options = _kernel(_config(info.limits))
        binary = compile_cubin(CompileRequest(source, launch.kernel, options))
        m = bench.measure(binary, launch, "attention", PROBLEM, seed=0)
    finally:
        bench.close()
    assert m.ok, m.reason
    assert m.gpu == {"uuid": info.uuid, "index": info.index, "name": info.name}
    assert info.uuid.startswith("GPU-") and isinstance(info.index, int)
    for when in ("before", "after"):
        clocks = m.clocks[when]
        assert 200 < clocks["sm_mhz"] < 3000 and clocks["mem_mhz"] > 0 and "temperature_c" in clocks
        assert clocks["power_w"] > 10  # under load: the warm-up runs when "before" is read


@pytest.mark.skipif(gpu_count() < 2, reason="fewer than two GPUs visible")
def test_every_gpu_times_the_incumbent_in_rounds(tmp_path):
    from workers import WorkerPool

    with WorkerPool("attention", PROBLEM, calibrate_every=2, cache_dir=tmp_path) as pool:
        assert pool.num_gpus >= 2 and len({g["uuid"] for g in pool.gpus}) == pool.num_gpus
        kernel = _kernel(_config(pool.limits))
        pool.set_incumbent(*kernel)
        for ticket in range(4):
            pool.submit(ticket, *kernel)
        results, calibrations = {}, []
        end = time.monotonic() + 120
        timed = lambda: {c.measurement.gpu["uuid"] for c in calibrations}  # noqa: E731
        while time.monotonic() < end and (len(results) < 4 or len(timed()) < pool.num_gpus):
            results.update(pool.poll(timeout=1.0))
            calibrations += pool.calibrations()
    assert len(results) == 4 and all(m.ok for m in results.values())
    # each GPU's first timing of the anchor (a GPU busy when a round starts takes the next one)
    first = {}
    for c in sorted(calibrations, key=lambda c: c.round):
        first.setdefault(c.measurement.gpu["uuid"], c)
    assert set(first) == {g["uuid"] for g in pool.gpus}
    medians = [c.measurement.timing.median_ms for c in first.values()]
    assert max(medians) / min(medians) < 1.2  # one model: a few percent apart
