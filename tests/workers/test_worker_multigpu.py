"""Several GPUs through real Ray actors: replay workers stand in for two GPUs of one model, the
second 4% slower (``WorkerPool(replay_gpus=...)``); each re-times the incumbent in rounds."""

from __future__ import annotations

import time

import pytest

import worker_family
from templates.family import Problem
from worker_doubles import FAKE_DEVICE
from workers import WorkerError, WorkerPool
from workers.replay import save_landscape
from workers.results import Measurement, Timing

PROBLEM = Problem((1024,), "fp32")
LAUNCH = worker_family.FAMILY.launch({"variant": "ok", "tag": 0}, PROBLEM)
TAGS = range(1, 11)


def _config(tag: int) -> dict:
    return {"variant": "ok", "tag": tag}


def _recorded(tag: int) -> Measurement:
    ms = 0.5 + 0.01 * tag
    return Measurement(ok=True, timing=Timing(ms, ms * 0.99, ms * 1.01, ms * 0.01, 50), error=1e-7)


@pytest.fixture
def two_gpus(ray_session, tmp_path):
    path = save_landscape(tmp_path / "land.json", device=FAKE_DEVICE, family=worker_family.NAME,
                          problem=PROBLEM, template_hash="abc",
                          entries=[(_config(tag), _recorded(tag)) for tag in TAGS])
    pool = WorkerPool(worker_family.NAME, PROBLEM, replay=path, replay_gpus=(1.0, 1.04),
                      calibrate_every=2, measure_timeout_s=10.0)
    yield pool
    pool.close()


def _until(pool, done, deadline_s=60.0):
    results, calibrations = {}, []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        results.update(pool.poll(timeout=0.5))
        calibrations += pool.calibrations()
        if done(results, calibrations):
            return results, calibrations
    timed = sorted((c.round, c.measurement.gpu.get("index")) for c in calibrations)
    raise AssertionError(f"not done: {len(results)} results, calibrations (round, GPU) {timed}")


def test_each_gpu_times_the_incumbent_in_rounds_and_says_which_gpu_it_is(two_gpus):
    pool = two_gpus
    assert pool.num_gpus == 2
    assert [g["uuid"] for g in pool.gpus] == ["GPU-replay-0", "GPU-replay-1"]
    assert [g["index"] for g in pool.gpus] == [0, 1] and pool.gpus[0]["name"] == FAKE_DEVICE.name
    pool.submit(0, _config(TAGS[0]), "", LAUNCH, ())
    first, _ = _until(pool, lambda r, c: len(r) >= 1)
    incumbent = _config(TAGS[0])
    pool.set_incumbent(incumbent, "", LAUNCH, ())
    # the first round starts once the incumbent is compiled: both GPUs are idle and time it
    _, calibrations = _until(pool, lambda r, c: {x.measurement.gpu["index"] for x in c if x.round == 1} == {0, 1})
    for ticket, tag in enumerate(TAGS):
        if ticket:
            pool.submit(ticket, _config(tag), "", LAUNCH, ())
    # every trial back and a later round begun: a round starts after every trial here, and a GPU
    # times the round current when it has room, before its next trial (so it may skip one)
    results, later = _until(pool, lambda r, c: len(r) == len(TAGS) - 1 and c)
    calibrations += later
    results.update(first)
    by_gpu = {0: [], 1: []}
    for ticket, m in results.items():
        recorded = _recorded(list(TAGS)[ticket]).timing.median_ms
        gpu = m.gpu["index"]
        by_gpu[gpu].append(ticket)
        assert m.gpu["uuid"] == f"GPU-replay-{gpu}" and m.replayed
        assert m.timing.median_ms == pytest.approx(recorded * (1.04 if gpu else 1.0), rel=1e-12)
    assert by_gpu[0] and by_gpu[1]  # the pool kept both GPUs busy
    rounds = {}
    for c in calibrations:  # every round: the incumbent, on each GPU once
        rounds.setdefault(c.round, {})[c.measurement.gpu["index"]] = c
        assert c.params == incumbent and c.measurement.ok and c.measurement.replayed
    for number, timed in rounds.items():
        if len(timed) == 2:
            assert timed[1].measurement.timing.median_ms / timed[0].measurement.timing.median_ms == \
                pytest.approx(1.04, rel=1e-12)
    assert len(rounds) >= 2 and any(len(timed) == 2 for timed in rounds.values())


def test_the_retiming_runs_on_the_first_gpu(two_gpus):
    retiming = two_gpus.retime([(_config(tag), "", LAUNCH, ()) for tag in (1, 2)])
    assert retiming.gpu["uuid"] == "GPU-replay-0"
    assert [m.timing.median_ms for m in retiming.measurements] == [0.51, 0.52]


def test_replay_gpus_needs_a_replay(ray_session):
    with pytest.raises(ValueError, match="replay_gpus goes with replay"):
        WorkerPool(worker_family.NAME, PROBLEM, replay_gpus=(1.0, 1.04))


@pytest.mark.parametrize("gpus", [1, 3])
def test_every_pool_calls_its_gpus_through_one_agent_a_node(ray_session, tmp_path, gpus):
    """One path for every measurement: posted to the node's agent (``workers.agent``), one GPU
    or several."""
    path = save_landscape(tmp_path / "land.json", device=FAKE_DEVICE, family=worker_family.NAME,
                          problem=PROBLEM, template_hash="abc",
                          entries=[(_config(tag), _recorded(tag)) for tag in TAGS])
    pool = WorkerPool(worker_family.NAME, PROBLEM, replay=path, replay_gpus=(1.0,) * gpus)
    try:
        assert len(pool._agents) == 1 and {slot.post_to.host for slot in pool._slots} == {pool._agents[0]}
        pool.submit(0, _config(TAGS[0]), None, LAUNCH, ())
        (ticket, measurement), = _until(pool, lambda results, _: results)[0].items()
        assert ticket == 0 and measurement.ok
    finally:
        pool.close()


def test_a_bench_that_takes_no_requests_is_one_line(ray_session, tmp_path):
    class Plain:  # measure() alone: the pool posts packed requests (workers.request)
        def device_info(self):
            return FAKE_DEVICE

    path = save_landscape(tmp_path / "land.json", device=FAKE_DEVICE, family=worker_family.NAME,
                          problem=PROBLEM, template_hash="abc",
                          entries=[(_config(tag), _recorded(tag)) for tag in TAGS])
    with pytest.raises(WorkerError, match=r"^Plain takes no measurement requests: derive it from "
                                          r"workers.request.TakesRequests$"):
        WorkerPool(worker_family.NAME, PROBLEM, replay=path, worker_cls=Plain)


def test_the_second_and_third_rounds_come_sooner_then_one_every_calibrate_every():
    """Rounds (every=40, two GPUs): the first at the incumbent, the next after 20, 40 and then
    80 trials measured over the pool (10, 20, 40 a GPU): three rounds by 30 trials a GPU, so that
    one odd round no longer moves the median; the first incumbent made ready is the anchor, and
    stays."""
    from workers.calibrate import CalibrationSchedule

    schedule = CalibrationSchedule(2, every=40)
    starts, incumbents = [], []
    for trial in range(1, 301):
        if trial == 1:
            schedule.offer("a", "config a")
            schedule.ready("a")
        if trial == 35:  # a new incumbent, mid-gap
            schedule.offer("b", "config b")
            schedule.ready("b")
        before = schedule.round
        schedule.counted()
        if schedule.round != before or trial == 1:
            starts.append(trial)
            incumbents.append(schedule.item)
    assert starts == [1, 20, 60, 140, 220, 300]
    assert incumbents == ["config a"] * 6  # the first incumbent timed stays the anchor
    one = CalibrationSchedule(1, every=1)
    one.offer("a", "config a")
    one.ready("a")
    assert one.round == 1 and one.gap() == 1  # a quarter of 1, rounded up: never 0
