"""How many measurements a GPU actor holds at once (``workers.depth``)."""

from __future__ import annotations

import pytest

from workers.depth import MAX_DEPTH, MIN_DEPTH, SAMPLES, ActorDepth


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


def test_the_depth_waits_for_samples_and_ignores_trials_without_gpu_time():
    assert _fed(absence_s=1.0, trial_s=0.03, n=SAMPLES - 2).value == MIN_DEPTH
    depth = _fed(absence_s=0.03, trial_s=0.24)
    for _ in range(100):
        depth.measured(0.0)  # shared or screened results: no GPU time
    assert depth.value == MIN_DEPTH


def test_a_bad_range_is_refused():
    with pytest.raises(ValueError, match="actor depth"):
        ActorDepth(minimum=3, maximum=2)
