"""The output checks that run on the GPU count what the host would, and the resident buffers
read back only what a family's validate indexes.

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import numpy as np
import pytest

from templates import get_family
from templates.family import check_outputs, count_nonfinite

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def bench():
    from workers.gpu import GpuBench

    gpu = GpuBench(0)
    yield gpu
    gpu.close()


def _upload(values: np.ndarray):
    from workers.device_checks import padded
    from workers.driver import check_call, driver_api

    d = driver_api()
    ptr = check_call("cuMemAlloc", d.cuMemAlloc(padded(values.nbytes)))
    check_call("cuMemsetD8", d.cuMemsetD8(ptr, 0, padded(values.nbytes)))
    check_call("cuMemcpyHtoD", d.cuMemcpyHtoD(ptr, values.ctypes.data, values.nbytes))
    return ptr


@pytest.mark.parametrize("element, dtype", [("fp16", np.float16), ("fp32", np.float32), ("bf16", None)])
def test_nonfinite_and_unequal_counts_match_the_host(bench, element, dtype):
    from workers.driver import driver_api

    rng = np.random.default_rng(5)
    n = 3 * 1000 * 1000 + 7  # not a whole number of vectors
    if dtype is None:
        raw = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        raw[rng.integers(0, n, 50)] = 0x7FC0
        raw[-1] = 0xFF80
    else:
        values = rng.standard_normal(n).astype(dtype)
        values[rng.integers(0, n, 50)] = np.nan
        values[[0, -1]] = [np.inf, -np.inf]
        raw = values.view(np.uint16 if dtype == np.float16 else np.uint32)
    other = raw.copy()
    other[[1, n // 2, -1]] ^= 1
    first, second = _upload(raw), _upload(other)
    try:
        bench.checks.begin()
        bad = bench.checks.nonfinite(first, raw.nbytes, element)
        same = bench.checks.unequal(first, first, raw.nbytes)
        differ = bench.checks.unequal(first, second, raw.nbytes)
        sums = [bench.checks.checksum(first, raw.nbytes), bench.checks.checksum(second, raw.nbytes)]
        counts = bench.checks.collect()
    finally:
        driver_api().cuMemFree(first)
        driver_api().cuMemFree(second)
    assert counts[bad] == count_nonfinite(raw, element) > 50 - 5
    assert counts[same] == 0 and counts[differ] == 3
    assert counts[sums[0]] != counts[sums[1]]


def test_attention_outputs_are_checked_on_the_device_and_read_in_part(bench):
    """A resident problem's views agree with the host's check of the same output."""
    family = get_family("attention")
    problem = family.parse_problem("2,3,300,64", "bf16", {"causal": True})
    resident = bench.resident(family, problem, seed=4)
    assert bench.resident(family, problem, seed=4) is resident  # kept for the next trial
    rng = np.random.default_rng(1)
    values = rng.standard_normal(problem.shape).astype(np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    from workers.driver import check_call, driver_api

    ptr, nbytes = resident.buffers["o"]
    check_call("cuMemcpyHtoD", driver_api().cuMemcpyHtoD(ptr, bits.ctypes.data, nbytes))
    view = resident.views()["o"]
    assert np.array_equal(view[1, 2], bits[1, 2]) and np.array_equal(np.asarray(view), bits)
    on_host = check_outputs(family, problem, resident.inputs, {"o": bits})
    on_device = family.validate(problem, resident.inputs, resident.views())
    assert not on_host.ok and on_device.error == pytest.approx(on_host.error)
    assert bench.residents.changed() is None
