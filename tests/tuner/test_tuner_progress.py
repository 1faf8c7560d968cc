"""Progress lines: throttled status, one line per new best, rate and ETA."""

from __future__ import annotations

import logging

from tuner.study.progress import BestSoFar, Progress, format_seconds
from tuner_doubles import FakeClock


def test_status_is_throttled_and_every_new_best_is_logged(caplog):
    clock = FakeClock()
    progress = Progress("s", trials=10, interval=5.0, clock=clock)
    caplog.set_level(logging.INFO, logger="tuner")
    progress.tick(3)
    assert not caplog.records  # less than 5 s since the start
    clock.now += 2
    assert progress.measured(0, {"A": 1}, failure=None, median_ms=2.0, tflops=100.0)
    assert not progress.measured(1, {"A": 2}, failure=None, median_ms=3.0, tflops=50.0)
    assert not progress.measured(2, {"A": 3}, failure="compile", median_ms=None, tflops=None)
    assert progress.measured(3, {"A": 4}, failure=None, median_ms=1.0, tflops=200.0)
    bests = [r.getMessage() for r in caplog.records if "new best" in r.getMessage()]
    assert bests == ["new best (trial 0): 2.0000 ms 100.0 TFLOPS {A: 1}",
                     "new best (trial 3): 1.0000 ms 200.0 TFLOPS {A: 4}"]
    clock.now += 3
    progress.tick(2)
    line = caplog.records[-1].getMessage()
    assert line.startswith("4/10 measured (1 failed: compile 1; 0 reused, 0 invalid), 2 in flight")
    assert "best 1.0000 ms" in line and "48.0 trials/min" in line and "ETA 8s" in line
    clock.now += 1
    progress.tick(2)
    assert caplog.records[-1].getMessage() == line  # throttled: nothing new


def test_a_new_best_still_being_recorded_is_logged_without_its_number(caplog):
    progress = Progress("s", trials=10, clock=FakeClock())
    caplog.set_level(logging.INFO, logger="tuner")
    assert progress.measured(None, {"A": 5}, failure=None, median_ms=0.5, tflops=400.0)
    assert caplog.records[-1].getMessage() == "new best (a trial being recorded): 0.5000 ms 400.0 TFLOPS {A: 5}"


def test_eta_is_the_earlier_of_trials_and_time_budget():
    clock = FakeClock()
    progress = Progress("s", trials=100, time_budget=60.0, clock=clock)
    progress.resumed(50, BestSoFar(1.0, None, {}, 0))
    clock.now += 10
    for n in range(10):
        progress.measured(n, {}, failure=None, median_ms=5.0, tflops=None)
    assert progress.eta() == 40.0  # time budget first: 40 s < 40 trials at 1/s
    assert Progress("s", clock=clock).eta() is None


def test_format_seconds():
    assert [format_seconds(s) for s in (5, 65, 3700)] == ["5s", "1m05s", "1h01m"]
