"""The timing method on a real GPU: a held stream runs nothing until released, a hold the host
never releases ends by itself, and on a ~10 us kernel the held events are no more than 5%
above ``triton.testing.do_bench`` (a held repetition times no host work), for ours and for a
peer. Below do_bench is expected: do_bench's flush (a zeroing of 256 MB) leaves the L2 full of
dirty lines and it times their write-back, where the workers' flush reads the L2's size and
leaves clean lines (``workers.hold``); and on microsecond peers whose host dispatch is about as
long as that zeroing, do_bench's median holds host time. On an H100 (2026-11-27) ours timed
9.41 us held and 10.50 us by do_bench (with a flush by memset, as do_bench's, the two had agreed
within 5%); SDPA flash timed 15.84 and 15.58 us held and 22.30 and 32.58 us by do_bench in two
runs of four (on 2026-11-26: 16 against 29-33 us). From below, a peer's held median
is checked against ``triton.testing.do_bench_cudagraph`` (a CUDA graph: no host time, and a hot
L2, which a cold repetition cannot beat); ours against 0.6 of do_bench.

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import time

import pytest

from templates import get_family
from workers.driver import check_call, driver_api

pytestmark = pytest.mark.gpu

FAMILY = get_family("attention")
PROBLEM = FAMILY.parse_problem("1,8,512,64", "fp16", {"causal": False})  # 10-15 us kernels


@pytest.fixture(scope="module")
def bench():
    from workers.gpu import GpuBench

    gpu = GpuBench(0)
    yield gpu
    gpu.close()


def test_a_held_stream_runs_nothing_until_released(bench):
    d = driver_api()
    event = bench.event()
    before = bench.hold.timeouts
    with bench.hold:
        check_call("cuEventRecord", d.cuEventRecord(event, bench.stream))
        time.sleep(0.05)
        assert d.cuEventQuery(event)[0] == d.CUresult.CUDA_ERROR_NOT_READY
    check_call("cuStreamSynchronize", d.cuStreamSynchronize(bench.stream))
    assert d.cuEventQuery(event)[0] == d.CUresult.CUDA_SUCCESS
    assert bench.hold.timeouts == before
    bench.spare([event])


def test_a_hold_never_released_times_out(bench):
    from workers.hold import TIMEOUT_NS

    d = driver_api()
    before = bench.hold.timeouts
    bench.hold.__enter__()
    try:
        time.sleep(TIMEOUT_NS / 1e9 + 0.2)
        check_call("cuStreamSynchronize", d.cuStreamSynchronize(bench.stream))
    finally:
        bench.hold.__exit__(None, None, None)
    assert bench.hold.timeouts == before + 1


def _agree(held: float, second: float) -> bool:
    """``held`` at most 5% above ``second`` (do_bench's, which times a write-back and at times
    host work) and not below 0.6 of it."""
    return 0.6 < held / second < 1.05


def test_held_events_and_do_bench_agree_on_a_10us_kernel_of_ours(bench):
    pytest.importorskip("triton")
    from workers.local import LocalBench

    params = FAMILY.starting_points(PROBLEM, bench.device_info().limits)[0]
    kernel = ("attention", PROBLEM, FAMILY.render(params, PROBLEM), FAMILY.launch(params, PROBLEM),
              FAMILY.compile_options(params, PROBLEM))
    with LocalBench() as local:
        held = local.measure(*kernel)
        second = local.do_bench(*kernel)
    assert held.ok and held.timing.median_ms < 0.030 and second is not None
    assert _agree(held.timing.median_ms, second), (held.timing.median_ms, second)


def test_held_events_of_a_10us_peer_lie_between_a_hot_cuda_graph_and_do_bench():
    pytest.importorskip("triton")
    from triton.testing import do_bench_cudagraph

    from workers.peers import time_peers

    found = time_peers("attention", PROBLEM)
    calls = FAMILY.peers(PROBLEM, FAMILY.inputs(PROBLEM, 0))
    for name in ("flash", "cudnn"):
        peer = found[name]
        assert peer.median_ms is not None and peer.median_ms < 0.030 and peer.check_ms is not None, peer
        hot = do_bench_cudagraph(calls[name].run, return_mode="median")
        assert 0.95 * hot < peer.median_ms < 1.05 * peer.check_ms, (peer, hot)

