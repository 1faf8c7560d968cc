"""On a real GPU: the tiny family's variants end in the right outcome (skipped without one).

Tests that kill the CUDA context run under the pool, in Ray actors, never in this process.
"""

from __future__ import annotations

import time

import pytest

import worker_family
from templates.family import Problem
from workers.compile import compile_cubin
from workers.results import CompileRequest

pytestmark = pytest.mark.gpu

PROBLEM = Problem((1 << 20,), "fp32")
FAMILY = worker_family.FAMILY


def _binary(variant: str, tag: int = 0):
    params = {"variant": variant, "tag": tag}
    source = FAMILY.render(params, PROBLEM)
    launch = FAMILY.launch(params, PROBLEM)
    return compile_cubin(CompileRequest(source, launch.kernel, ("-O3",))), launch


@pytest.fixture(scope="module")
def bench():
    from workers.gpu import GpuBench

    bench = GpuBench()
    yield bench
    bench.close()


def test_device_info(bench):
    info = bench.device_info()
    assert info.sm_count > 0 and info.compute_capability[0] >= 9
    assert info.max_smem_per_block_optin > 48 * 1024 and info.uuid.startswith("GPU-")


@pytest.mark.parametrize("variant", ["ok", "smem_ok"])
def test_measures_the_tiny_kernel(bench, variant):
    binary, launch = _binary(variant)
    m = bench.measure(binary, launch, worker_family.NAME, PROBLEM, seed=1)
    assert m.ok, (m.failure, m.reason, m.detail)
    assert m.error < 1e-6 and m.timing.repetitions >= 20
    assert 0 < m.timing.min_ms <= m.timing.median_ms <= m.timing.max_ms < 10
    assert m.gpu_seconds > 0 and m.cubin_hash == binary.cubin_hash and not bench.dead


def test_unwritten_element_is_wrong(bench):
    binary, launch = _binary("hole")
    m = bench.measure(binary, launch, worker_family.NAME, PROBLEM)
    assert m.failure == "wrong" and "unwritten" in m.reason and not bench.dead


def test_too_much_shared_memory_is_resources(bench):
    binary, launch = _binary("smem_big")
    m = bench.measure(binary, launch, worker_family.NAME, PROBLEM)
    assert m.failure == "resources" and not bench.dead


def test_too_many_threads_is_resources(bench):
    from dataclasses import replace

    binary, launch = _binary("ok")
    m = bench.measure(binary, replace(launch, block=(2048, 1, 1)), worker_family.NAME, PROBLEM)
    assert m.failure == "resources" and not bench.dead
    again = bench.measure(binary, launch, worker_family.NAME, PROBLEM)  # the context lives on
    assert again.ok


def _drain(pool, deadline_s=120.0):
    results, end = {}, time.monotonic() + deadline_s
    while pool.pending() and time.monotonic() < end:
        results.update(pool.poll(timeout=1.0))
    return results


def test_pool_on_the_gpu_crash_and_timeout(ray_session, tmp_path):
    from workers import WorkerPool

    with WorkerPool(worker_family.NAME, PROBLEM, measure_timeout_s=10.0, cache_dir=tmp_path) as pool:
        assert pool.num_gpus >= 1 and pool.limits.sm_count > 0
        for ticket, variant in enumerate(["ok", "oob"]):
            params = {"variant": variant, "tag": ticket}
            pool.submit(ticket, params, FAMILY.render(params, PROBLEM), FAMILY.launch(params, PROBLEM), ("-O3",))
        results = _drain(pool)
        assert results[0].ok, results[0]
        assert results[1].failure == "crash" and results[1].detail == "CUDA_ERROR_ILLEGAL_ADDRESS"
        params = {"variant": "loop", "tag": 2}
        pool.submit(2, params, FAMILY.render(params, PROBLEM), FAMILY.launch(params, PROBLEM), ())
        assert _drain(pool)[2].failure == "timeout"
        params = {"variant": "ok", "tag": 3}
        pool.submit(3, params, FAMILY.render(params, PROBLEM), FAMILY.launch(params, PROBLEM), ())
        assert _drain(pool)[3].ok  # on a fresh actor, after the crash and the hang


@pytest.mark.parametrize("variant", ["scribble", "clobber"])
def test_a_kernel_that_writes_into_its_input_fails_and_the_next_gets_fresh_inputs(bench, variant):
    binary, launch = _binary(variant)
    m = bench.measure(binary, launch, worker_family.NAME, PROBLEM, seed=2)
    assert m.failure == "wrong" and m.reason == "the kernel wrote into its input 'x'"
    binary, launch = _binary("ok", tag=1)
    again = bench.measure(binary, launch, worker_family.NAME, PROBLEM, seed=2)
    assert again.ok and again.error < 1e-6, again
