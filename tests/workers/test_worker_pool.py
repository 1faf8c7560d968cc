"""The pool end to end through real Ray actors; test doubles stand in for the GPU."""

from __future__ import annotations

import time

import pytest

import worker_family
from ptxas_kernels import early_read_kernel
from workers.driver import gpu_count
from templates.family import Problem
from worker_doubles import FAKE_DEVICE, FakeBench, PreparingBench, TwoFakeBenches, TwoPreparingBenches
from workers import NoGPUError, WorkerPool
from workers.replay import save_landscape
from workers.results import Measurement, Timing

PROBLEM = Problem((1024,), "fp32")
FAMILY = worker_family.FAMILY
TIMEOUT = 3.0
HAS_GPU = gpu_count() > 0


def _source(tag: int, variant: str = "ok") -> str:
    return FAMILY.render({"variant": variant, "tag": tag}, PROBLEM)


LAUNCH = FAMILY.launch({"variant": "ok", "tag": 0}, PROBLEM)


def _submit(pool, ticket, behaviour="ok", tag=None, source=None):
    source = source or _source(ticket if tag is None else tag)
    pool.submit(ticket, {"behaviour": behaviour, "tag": ticket}, source, LAUNCH, ())


def _drain(pool, deadline_s=60.0) -> dict[int, Measurement]:
    results = {}
    end = time.monotonic() + deadline_s
    while pool.pending() and time.monotonic() < end:
        results.update(pool.poll(timeout=1.0))
    assert not pool.pending(), f"still pending: {pool.pending()}"
    return results


@pytest.fixture
def pool_factory(ray_session, tmp_path):
    """Pools of test doubles, called through node agents as every pool's actors are
    (``workers.agent``: the doubles take packed requests, as GpuBench does)."""
    pools = []

    def make(worker_cls=FakeBench, **kw):
        kw.setdefault("measure_timeout_s", TIMEOUT)
        pool = WorkerPool(worker_family.NAME, PROBLEM, worker_cls=worker_cls, backend="nvrtc",
                          cache_dir=tmp_path / "cache", **kw)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def test_ok_measurements(pool_factory):
    pool = pool_factory()
    assert pool.device == FAKE_DEVICE and pool.limits.sm_count == 132
    for ticket in range(3):
        _submit(pool, ticket)
    assert pool.pending() == 3
    results = _drain(pool)
    assert sorted(results) == [0, 1, 2]
    assert all(m.ok and m.resources.registers > 0 and m.cubin_hash for m in results.values())
    assert pool.gpu_busy_seconds == pytest.approx(1.5)


# The family's kernel, its wgmma's accumulators read before the wait.
EARLY_READ = early_read_kernel('extern "C" __global__ void scale(float* y, const float* x, float a, int n)')


def test_ptxas_notes_of_a_cut_wgmma_pipeline_travel_with_the_measurement(pool_factory):
    pool = pool_factory()
    _submit(pool, 0, source=EARLY_READ)
    _submit(pool, 1)
    results = _drain(pool)
    assert results[0].ok and any(a.startswith("C7517: warpgroup.wait is injected") for a in results[0].advisories)
    assert results[1].ok and results[1].advisories == ()


def test_hang_times_out_and_the_pool_goes_on(pool_factory):
    pool = pool_factory()
    _submit(pool, 0, "hang")
    _submit(pool, 1)  # queued behind the hang: re-dispatched to the fresh actor
    _submit(pool, 2)
    results = _drain(pool)
    assert results[0].failure == "timeout"
    assert results[1].ok and results[2].ok


def test_dead_process_is_a_worker_failure_and_replaced(pool_factory):
    pool = pool_factory()
    _submit(pool, 0, "exit")
    _submit(pool, 1)
    results = _drain(pool)
    assert results[0].failure == "worker"
    assert results[1].ok


def test_crash_replaces_the_actor(pool_factory):
    pool = pool_factory()
    _submit(pool, 0)
    first = _drain(pool)[0]
    _submit(pool, 1, "crash")
    assert _drain(pool)[1].failure == "crash"
    _submit(pool, 2)
    results = _drain(pool)
    assert results[2].ok
    assert results[2].detail.split()[0] != first.detail.split()[0]  # another process (pid)


def test_a_new_actor_is_told_the_problem_before_its_first_trial(pool_factory):
    pool = pool_factory(PreparingBench, seed=5)
    expected = f"prepared={worker_family.NAME}|{PROBLEM.key}|5"
    _submit(pool, 0)
    assert expected in _drain(pool)[0].detail
    _submit(pool, 1, "crash")
    _drain(pool)
    _submit(pool, 2)
    assert expected in _drain(pool)[2].detail  # the replacement too
    plain = pool_factory()  # a bench without prepare() is not asked to
    _submit(plain, 3)
    assert "prepared=None" in _drain(plain)[3].detail


def test_a_crash_sends_the_trial_queued_behind_it_to_the_new_actor(pool_factory):
    pool = pool_factory()
    _submit(pool, 0, "crash")
    _submit(pool, 1)  # sent to the same actor before the crash was known
    _submit(pool, 2)
    results = _drain(pool)
    assert results[0].failure == "crash"
    assert results[1].ok and results[2].ok  # measured again on the replacement, not "dead"


def _times(measurement: Measurement) -> tuple[float, float]:
    fields = dict(part.split("=") for part in measurement.detail.split())
    return float(fields["start"]), float(fields["end"])


def _three_slow_two_sent(pool_factory):
    """A one-GPU pool given three slow trials, once two are compiled and sent: (pool, its slot)."""
    pool = pool_factory()
    for ticket in range(3):
        _submit(pool, ticket, "slow")
    (slot,) = pool._slots
    end = time.monotonic() + 60
    while len(slot.sent) < 2 and time.monotonic() < end:
        assert not pool.poll(timeout=0.05)
    return pool, slot


def test_the_actor_starts_the_next_trial_without_waiting_for_a_poll(pool_factory):
    pool, slot = _three_slow_two_sent(pool_factory)
    time.sleep(2.0)  # the coordinator is busy elsewhere: nobody polls
    polled = time.time()
    results = _drain(pool)
    # in the order the actor ran them: the compiles finish in any order, and so are sent
    (_, end0), (start1, end1), (start2, _) = sorted(_times(results[t]) for t in range(3))
    assert end1 < polled  # the second was sent with the first and ran meanwhile
    assert start1 - end0 < 0.25
    assert start2 >= polled - 0.05  # the third waited in the pool's queue for a poll


def test_serving_between_asks_sends_the_next_trial_and_keeps_what_finished(pool_factory):
    pool, slot = _three_slow_two_sent(pool_factory)
    serving = time.monotonic() + 2.0
    while time.monotonic() < serving:  # the coordinator asks its sampler, serving the pool between
        pool.serve()
        time.sleep(0.01)
    assert not slot.sent  # all three ran meanwhile
    results = dict(pool.poll(timeout=0))  # taken in by serve, handed out by the next poll
    assert sorted(results) == [0, 1, 2] and all(m.ok for m in results.values())
    (_, end0), (start1, end1), (start2, _) = sorted(_times(results[t]) for t in range(3))
    assert start1 - end0 < 0.25
    assert start2 - end1 < 0.25  # sent by a serve, not left in the pool's queue for a poll
    assert not pool.pending() and pool.poll(timeout=0) == []


def test_bench_exception_fails_the_trial_only(pool_factory):
    pool = pool_factory()
    _submit(pool, 0, "raise")
    _submit(pool, 1)
    results = _drain(pool)
    assert results[0].failure == "worker" and "the bench broke" in results[0].reason
    assert results[1].ok


def test_compile_error_resolves_the_ticket(pool_factory):
    pool = pool_factory()
    pool.submit(0, {}, "this is not CUDA", LAUNCH, ())
    _submit(pool, 1)
    results = _drain(pool)
    assert results[0].failure == "compile" and "error" in results[0].detail.lower()
    assert "\n" not in results[0].reason
    assert results[1].ok


def test_a_config_without_source_is_rendered_where_it_compiles(pool_factory):
    """``submit`` with no source (as the coordinator sends them): the compile task renders the
    params with the family, the same cubin as the source rendered here; a config the family
    cannot render fails as a compile, with its reason, and the pool goes on."""
    pool = pool_factory()
    pool.submit(0, {"variant": "ok", "tag": 3, "behaviour": "ok"}, None, LAUNCH, ())
    pool.submit(1, {"variant": "no such variant", "tag": 3}, None, LAUNCH, ())
    _submit(pool, 2, tag=3)  # the same config, its source given: the same cubin
    results = _drain(pool)
    assert results[0].ok and results[0].cubin_hash == results[2].cubin_hash
    assert results[1].failure == "compile" and results[1].reason.startswith("render: KeyError")


def test_a_trial_goes_to_an_idle_gpu_before_a_place_behind_a_running_one(pool_factory):
    pool = pool_factory(worker_cls=TwoFakeBenches)
    _submit(pool, 0, "slower")
    end = time.monotonic() + 60
    while not any(slot.sent for slot in pool._slots) and time.monotonic() < end:
        assert not pool.poll(timeout=0.05)
    busy = next(slot for slot in pool._slots if slot.sent)
    for ticket in (1, 2):  # one at a time, as the last compiles of a study come back
        _submit(pool, ticket, "slower")
        while sum(len(slot.sent) for slot in pool._slots) < ticket + 1 and time.monotonic() < end:
            assert not pool.poll(timeout=0.05)
        assert sorted(len(slot.sent) for slot in pool._slots) == ([1, 1] if ticket == 1 else [1, 2])
    idle = next(slot for slot in pool._slots if slot is not busy)
    assert [item.ticket for item, _ in idle.sent][0] == 1
    results = _drain(pool)
    assert sorted(results) == [0, 1, 2] and len({m.detail.split()[0] for m in results.values()}) == 2


def test_the_incumbent_is_timed_on_each_gpu_with_fewer_repetitions_and_never_stopped_early(pool_factory):
    pool = pool_factory(worker_cls=TwoFakeBenches)
    pool.set_abort_above(5.0)
    pool.set_incumbent({"behaviour": "ok", "tag": 99}, _source(99), LAUNCH, ())
    for ticket in range(2):
        _submit(pool, ticket)
    results, calibrations = _drain(pool), []
    end = time.monotonic() + 30
    while len(calibrations) < 2 and time.monotonic() < end:
        pool.poll(timeout=0.2)
        calibrations += pool.calibrations()
    assert sorted(c.round for c in calibrations) == [1, 1]  # one round: the incumbent on each GPU
    for c in calibrations:
        assert "abort_above_ms=None max_reps=50 target_ms=75.0" in c.measurement.detail
    for m in results.values():  # the trials: the bench's own timing, with the early-stop bar
        assert "abort_above_ms=5.0 max_reps=200 target_ms=300.0" in m.detail


def test_once_the_anchor_is_compiled_every_trial_is_sent_with_it_to_be_timed_beside_it(pool_factory):
    """Several GPUs: the anchor's binary and launch travel with each trial dispatched after it
    was compiled (``workers.paired``); its own timings in rounds do not carry it."""
    pool = pool_factory(worker_cls=TwoFakeBenches)
    pool.set_incumbent({"behaviour": "ok", "tag": 99}, _source(99), LAUNCH, ())
    calibrations: list = []
    end = time.monotonic() + 30
    while len(calibrations) < 2 and time.monotonic() < end:
        pool.poll(timeout=0.2)
        calibrations += pool.calibrations()
    assert len(calibrations) == 2 and all("anchor=None" in c.measurement.detail for c in calibrations)
    for ticket in range(4):
        _submit(pool, ticket)
    results = _drain(pool)
    anchors = {m.detail.split("anchor=")[1].split()[0] for m in results.values()}
    assert len(results) == 4 and len(anchors) == 1 and anchors != {"None"}
    assert pool._schedule.anchor.binary.cubin_hash in anchors  # the anchor's own cubin


def test_a_measuring_pool_takes_the_next_problem_with_its_actors_and_starts_over(pool_factory):
    """The GPUs of one list's problems are started once (``retarget``): each actor is told the
    next problem, and the anchor, the results and the busy seconds of the last start over."""
    pool = pool_factory(worker_cls=TwoPreparingBenches, seed=3)
    pool.set_incumbent({"behaviour": "ok", "tag": 99}, _source(99), LAUNCH, ())
    for ticket in range(4):
        _submit(pool, ticket)
    _drain(pool)
    end = time.monotonic() + 30
    while pool._schedule.anchor is None and time.monotonic() < end:
        pool.poll(timeout=0.2)
    assert pool._schedule.anchor is not None and pool.gpu_busy_seconds > 0
    _submit(pool, 10, "slow")
    assert not pool.retarget(Problem((2048,), "fp32"))  # work in flight: refused, nothing changed
    assert pool.problem == PROBLEM
    _drain(pool)
    actors = [slot.actor._actor_id for slot in pool._slots]
    other = Problem((2048,), "fp32")
    assert not pool.retarget(other, replay="landscape.json")  # GPUs do not replay
    assert pool.retarget(other)
    assert pool.problem == other and pool.gpu_busy_seconds == 0.0 and pool._schedule.anchor is None
    for ticket in range(20, 24):
        _submit(pool, ticket)
    after = _drain(pool)
    assert sorted(after) == [20, 21, 22, 23] and all(m.ok for m in after.values())
    assert all(f"prepared={worker_family.NAME}|{other.key}|3" in m.detail for m in after.values())
    assert [slot.actor._actor_id for slot in pool._slots] == actors  # the same processes
    assert all("anchor=None" in m.detail for m in after.values())  # the last problem's anchor is gone


def test_equal_cubins_are_measured_once(pool_factory):
    pool = pool_factory(worker_cls=TwoFakeBenches)
    source = _source(7)
    for ticket in range(4):
        _submit(pool, ticket, source=source)
    results = _drain(pool)
    hashes = {m.cubin_hash for m in results.values()}
    assert len(hashes) == 1
    shared = [t for t, m in results.items() if "shared" in m.detail]
    assert len(shared) == 3
    assert all(results[t].ok for t in results)
    # the GPU's time is counted once, for the one measured: the worker's, the kernels', the flushes'
    assert (pool.gpu_busy_seconds, pool.kernel_busy_seconds, pool.flush_busy_seconds) == pytest.approx((0.5, 0.4, 0.05))


def test_replay_answers_from_the_landscape(pool_factory, tmp_path):
    recorded = Measurement(ok=True, timing=Timing(0.5, 0.4, 0.7, 0.05, 50), error=1e-7,
                           max_abs_error=1e-6, gpu_seconds=0.3)
    path = save_landscape(tmp_path / "land.json", device=FAKE_DEVICE, family=worker_family.NAME,
                          problem=PROBLEM, template_hash="abc",
                          entries=[({"variant": "ok", "tag": 1}, recorded)])
    pool = pool_factory(worker_cls=None, replay=path)
    assert pool.device == FAKE_DEVICE and pool.num_gpus == 0
    pool.submit(0, {"tag": 1, "variant": "ok"}, "", LAUNCH, ())
    pool.submit(1, {"variant": "ok", "tag": 2}, "", LAUNCH, ())
    results = _drain(pool)
    assert results[0].ok and results[0].replayed and results[0].timing == recorded.timing
    assert results[1].failure == "invalid" and results[1].replayed
    assert results[1].reason == "not in the recorded landscape"


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible here")
def test_no_gpu_and_no_replay_is_one_clear_error(ray_session):
    with pytest.raises(NoGPUError, match="no GPU visible to Ray") as info:
        WorkerPool(worker_family.NAME, PROBLEM)
    assert "\n" not in str(info.value)


SPILLING = """
extern "C" __global__ void spill(const float* in, float* out, int n) {
    float acc[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) acc[i] = in[(threadIdx.x + i * 37) % n];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + r + 1) % 96] + 1.0f;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 96; ++i) s += acc[i];
    out[threadIdx.x] = s;
}
"""


def test_heavy_spills_are_screened_before_the_gpu(pool_factory):
    pool = pool_factory()
    launch = type(LAUNCH)("spill", LAUNCH.grid, LAUNCH.block, 0, LAUNCH.args)
    pool.submit(0, {"tag": 0}, SPILLING, launch, ("--maxrregcount=32",))
    pool.submit(1, {"tag": 1}, SPILLING, launch, ())  # 128 registers, no spill: measured
    results = _drain(pool)
    assert results[0].failure == "screened" and "screened before the GPU" in results[0].reason
    assert results[0].resources.spill_stores > 256 and results[0].gpu_seconds == 0
    assert results[1].ok and results[1].resources.spill_stores == 0


def test_blocks_that_cannot_be_resident_are_screened_before_the_gpu(pool_factory):
    pool = pool_factory()
    big = type(LAUNCH)("spill", LAUNCH.grid, (1024, 1, 1), 0, LAUNCH.args)  # 128 registers x 1024
    too_much_smem = type(LAUNCH)("spill", LAUNCH.grid, LAUNCH.block, 240 * 1024, LAUNCH.args)
    pool.submit(0, {"tag": 0}, SPILLING, big, ())
    pool.submit(1, {"tag": 1}, SPILLING, too_much_smem, ())
    results = _drain(pool)
    assert results[0].failure == "screened" and "registers a block" in results[0].reason
    assert results[1].failure == "screened" and "bytes of shared memory" in results[1].reason
    assert results[0].gpu_seconds == results[1].gpu_seconds == 0


def test_the_early_stop_bar_reaches_the_bench(pool_factory):
    pool = pool_factory()
    _submit(pool, 0)
    first = _drain(pool)
    assert "abort_above_ms=None" in first[0].detail  # no bar until the coordinator sets one
    pool.set_abort_above(1.5)
    _submit(pool, 1)
    assert "abort_above_ms=1.5" in _drain(pool)[1].detail


# -- re-timing: several configs again, interleaved on one actor --------------------------------


def _config(tag, behaviour="ok", source=None):
    return ({"behaviour": behaviour, "tag": tag}, source or _source(tag), LAUNCH, ())


def test_retime_compiles_and_answers_in_order(pool_factory):
    pool = pool_factory()
    retiming = pool.retime([_config(3), _config(1, source="this is not CUDA"), _config(0)],
                           rounds=12)
    ok, bad, fast = retiming.measurements
    assert ok.ok and fast.ok and ok.timing.median_ms == 1.3 and fast.timing.median_ms == 1.0
    assert ok.timing.repetitions == fast.timing.repetitions == retiming.rounds == 12
    assert ok.cubin_hash and fast.cubin_hash and ok.cubin_hash != fast.cubin_hash
    assert ok.resources.registers > 0 and not ok.replayed and not retiming.replayed
    assert bad.failure == "compile" and "\n" not in bad.reason
    assert retiming.clocks_before["sm_mhz"] == 1980 and retiming.clocks_after["temperature_c"] == 52
    assert (pool.gpu_busy_seconds, pool.kernel_busy_seconds, pool.flush_busy_seconds) == pytest.approx((0.25, 0.2, 0.02))
    _submit(pool, 0)
    assert _drain(pool)[0].ok  # the pool goes on measuring afterwards


def test_retime_waits_for_an_idle_pool(pool_factory):
    pool = pool_factory()
    _submit(pool, 0)
    with pytest.raises(ValueError, match="in flight"):
        pool.retime([_config(1)])
    _drain(pool)


@pytest.mark.parametrize("behaviour, kind", [("hang", "timeout"), ("exit", "worker"),
                                             ("crash", "crash")])
def test_a_retime_that_breaks_fails_and_the_actor_is_replaced(pool_factory, behaviour, kind):
    pool = pool_factory(measure_timeout_s=1.0)
    _submit(pool, 0)
    before = _drain(pool)[0].detail.split()[0]
    retiming = pool.retime([_config(1), _config(2, behaviour)], max_seconds=0.5)
    assert retiming.measurements[1].failure == kind
    if behaviour != "crash":  # the whole re-timing is lost with the process
        assert retiming.measurements[0].failure == kind
    _submit(pool, 3)
    assert _drain(pool)[3].detail.split()[0] != before  # a fresh process


def test_retime_replays_the_landscape(pool_factory, tmp_path):
    recorded = Measurement(ok=True, timing=Timing(0.5, 0.4, 0.7, 0.05, 50), error=1e-7)
    path = save_landscape(tmp_path / "land.json", device=FAKE_DEVICE, family=worker_family.NAME,
                          problem=PROBLEM, template_hash="abc",
                          entries=[({"variant": "ok", "tag": 1}, recorded)])
    pool = pool_factory(worker_cls=None, replay=path)
    retiming = pool.retime([({"tag": 1, "variant": "ok"}, "", LAUNCH, ()),
                            ({"variant": "ok", "tag": 2}, "", LAUNCH, ())])
    found, missing = retiming.measurements
    assert retiming.replayed and retiming.rounds == 0 and found.replayed and missing.replayed
    assert found.timing == recorded.timing and missing.failure == "invalid"


def test_a_dead_node_agent_is_replaced_and_its_gpus_measurements_go_again(pool_factory):
    """A node agent killed with measurements out (its node lost, say): a new agent takes its
    slots, their actors are replaced, and every ticket is measured, none failed."""
    import ray

    pool = pool_factory(worker_cls=TwoFakeBenches)
    if not pool._agents:
        pytest.skip("a pool with node agents only")
    for ticket in range(4):
        _submit(pool, ticket, "slow")
    end = time.monotonic() + 60
    while sum(len(slot.sent) for slot in pool._slots) < 4 and time.monotonic() < end:
        assert not pool.poll(timeout=0.05)
    first = pool._agents[0]
    ray.kill(first, no_restart=True)
    results = _drain(pool)
    assert sorted(results) == [0, 1, 2, 3] and all(m.ok for m in results.values())
    assert len(pool._agents) == 2 and all(slot.post_to.host is pool._agents[1] for slot in pool._slots)
    assert sorted(r.why.split(":")[0] for r in pool.replacements()) == ["its node agent died"] * 2
