"""How many measurements a GPU actor holds at once (``workers.depth``)."""

from __future__ import annotations

import pytest

from workers.depth import HOLD_SHARE, MAX_DEPTH, MIN_DEPTH, SAMPLES, ActorDepth


def _fed(absence_s: float, trial_s: float, n: int = SAMPLES) -> ActorDepth:
    depth, now = ActorDepth(), 0.0
    for _ in range(n):
        depth.entered(now)
        now += 0.001  # in the pool
        depth.left(now)
        now += absence_s  # away: asking, storing
        depth.measured(trial_s)
    depth.entered(now)
    depth.measured(trial_s)
    return depth


def test_short_absences_beside_long_trials_keep_one_trial_queued():
    assert _fed(absence_s=0.03, trial_s=0.24).value == MIN_DEPTH == 2


def test_absences_as_long_as_the_trials_queue_more_up_to_the_maximum():
    assert _fed(absence_s=0.02, trial_s=0.03).value == 3  # 1 + ceil(2 * 20 / 30)
    assert _fed(absence_s=0.04, trial_s=0.03).value == MAX_DEPTH == 4  # 1 + ceil(80 / 30) = 4
    assert _fed(absence_s=1.0, trial_s=0.03).value == MAX_DEPTH


def test_trials_stopped_early_among_long_ones_queue_more():
    # one trial in five stopped early (40 ms) among quarter-second ones: a queued short trial
    # must cover the coordinator's absence too
    depth, now = ActorDepth(), 0.0
    for i in range(40):
        depth.entered(now)
        now += 0.001
        depth.left(now)
        now += 0.06  # an ask of TPE
        depth.measured(0.04 if i % 5 == 0 else 0.25)
    assert depth.value == MAX_DEPTH  # 1 + ceil(2 * 60 / 40)
    assert _fed(absence_s=0.06, trial_s=0.25).value == MIN_DEPTH  # every trial a long one


def test_the_depth_waits_for_samples_and_ignores_trials_without_gpu_time():
    assert _fed(absence_s=1.0, trial_s=0.03, n=SAMPLES - 2).value == MIN_DEPTH
    depth = _fed(absence_s=0.03, trial_s=0.24)
    for _ in range(100):
        depth.measured(0.0)  # shared or screened results: no GPU time
    assert depth.value == MIN_DEPTH


def test_a_collect_sent_as_the_coordinator_leaves_holds_for_half_its_usual_absence():
    assert _fed(absence_s=0.05, trial_s=0.03, n=SAMPLES - 1).hold() == 0.0  # too few absences yet
    assert _fed(absence_s=0.05, trial_s=0.03).hold() == pytest.approx(HOLD_SHARE * 0.05) == 0.025


def test_a_bad_range_is_refused():
    with pytest.raises(ValueError, match="actor depth"):
        ActorDepth(minimum=3, maximum=2)
