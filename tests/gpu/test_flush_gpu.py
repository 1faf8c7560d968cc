"""The workers' L2 flush leaves the cache as cold as a write of four times its size.

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import statistics

import pytest

from templates import get_family

pytestmark = pytest.mark.gpu

FAMILY = get_family("attention")
PROBLEM = FAMILY.parse_problem("2,8,512,64", "bf16", False)  # ~11-15 us kernels: the L2 matters most


def test_the_flush_is_as_cold_as_a_write_of_four_times_the_l2():
    from workers.driver import check_call, driver_api
    from workers.gpu import GpuBench
    from workers.trial import verified_trial

    d = driver_api()
    bench = GpuBench(0)
    try:
        info = bench.device_info()
        limits = info.limits
        trial = verified_trial(bench, FAMILY, PROBLEM, FAMILY.starting_points(PROBLEM, limits)[0])
        big = 4 * bench._attribute("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE")
        buffer = check_call("cuMemAlloc", d.cuMemAlloc(big))
        trial.warm_up(25.0)
        ours, four = [], []
        for _ in range(5):  # alternating blocks: drift falls on both
            ours += trial._repeat(100, True, 0)
            pairs = []
            for i in range(100):
                check_call("cuMemsetD32Async", d.cuMemsetD32Async(buffer, i, big // 4, bench.stream))
                pairs.append(trial._timed_run("first"))
            check_call("cuStreamSynchronize", d.cuStreamSynchronize(bench.stream))
            four += trial.elapsed(pairs)
        trial.release()
        check_call("cuMemFree", d.cuMemFree(buffer))
        ratio = statistics.median(ours) / statistics.median(four)
        assert ratio > 0.98, f"kernels after the workers' flush ran {ratio:.3f}x those after a 4x L2 write"
    finally:
        bench.close()
