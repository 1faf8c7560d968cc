"""Warm start: a new study first measures the winners of the nearest problems already tuned."""

from __future__ import annotations

import pytest

import tuner
from tuner.study.warmstart import WarmStart, nearest_winners, outcomes


def test_a_new_study_starts_from_the_nearest_winner_and_reports_how_it_did(toy, db, pools):
    first = tuner.tune("toy", "2,4,1024,64", "fp16", trials=20, db=db, seed=0)
    assert first.warm_start == ()  # nothing stored yet
    second = tuner.tune("toy", "2,4,4096,64", "fp16", trials=6, db=db, seed=0)
    (pick,) = second.warm_start
    assert pick.source == "2x4x1024x64-fp16" and pick.params == first.best.params
    assert pools.used[-1].submitted[0] == first.best.params  # measured before anything else
    assert pick.median_ms is not None and pick.ratio_to_best == pytest.approx(
        pick.median_ms / second.best.median_ms)
    assert pick.ratio_to_best >= 1.0
    resumed = tuner.tune("toy", "2,4,4096,64", "fp16", trials=8, db=db, seed=0)
    assert resumed.warm_start[0].params == pick.params  # the study remembers what it started from
    assert pools.used[-1].submitted[0] != pick.params  # but does not measure it again


def test_warm_start_can_be_turned_off_and_ignores_other_dtypes(toy, db, pools):
    tuner.tune("toy", "2,4,1024,64", "bf16", trials=10, db=db, seed=0)
    other = tuner.tune("toy", "2,4,2048,64", "fp16", trials=4, db=db, seed=0)
    assert other.warm_start == ()
    off = tuner.tune("toy", "2,4,2048,64", "bf16", trials=4, db=db, seed=0, warm_start=0)
    assert off.warm_start == ()


class _Best:
    def __init__(self, shape, params, dtype="fp16", causal=False):
        self.shape, self.params, self.dtype, self.flags = shape, params, dtype, {"causal": causal}


def test_nearest_winners_rank_by_log_distance_and_skip_other_head_dims(toy):
    problem = toy.parse_problem((2, 4, 4096, 64), "fp16")
    bests = [
        _Best((2, 4, 512, 64), {"BLOCK_M": 16, "BLOCK_N": 16, "WARPS": 1, "STAGES": 1}),
        _Best((2, 4, 8192, 64), {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 2, "STAGES": 1}),
        _Best((2, 4, 4096, 128), {"BLOCK_M": 32, "BLOCK_N": 32, "WARPS": 2, "STAGES": 1}),
        _Best((16, 4, 4096, 64), {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 2, "STAGES": 1}),  # same params
        _Best((2, 4, 2048, 64), {"BLOCK_M": 32, "BLOCK_N": 64, "WARPS": 2, "STAGES": 1}, causal=True),
    ]
    picks = nearest_winners(toy, problem, bests, limit=3)
    assert [p.source for p in picks] == ["2x4x8192x64-fp16", "2x4x512x64-fp16"]
    assert toy.distance(toy.parse_problem((2, 4, 8192, 64), "fp16"), problem) == 1.0
    assert toy.distance(toy.parse_problem((16, 4, 4096, 64), "fp16"), problem) == 3.0
    assert toy.distance(toy.parse_problem((2, 4, 8192, 64), "fp16", {"causal": True}), problem) == float("inf")


def test_outcomes_say_how_far_each_pick_was_from_the_best():
    class _Trial:
        def __init__(self, status, median_ms):
            self.status, self.median_ms = status, median_ms

    picks = [WarmStart("a", {"X": 1}, 1.0), WarmStart("b", {"X": 2}, 2.0)]
    done = outcomes(picks, {'{"X": 1}': _Trial("ok", 3.0), '{"X": 2}': _Trial("failed", None)}, 2.0)
    assert [(d.median_ms, d.ratio_to_best) for d in done] == [(3.0, 1.5), (None, None)]


def test_the_family_starting_points_are_measured_first_and_reported(toy, db, pools, monkeypatch):
    points = [dict(BLOCK_M=64, BLOCK_N=64, WARPS=4, STAGES=1), dict(BLOCK_M=128, BLOCK_N=32, WARPS=2, STAGES=1)]
    monkeypatch.setattr(toy, "starting_points", lambda problem, device: [dict(p) for p in points], raising=False)
    result = tuner.tune("toy", "2,4,1024,64", "fp16", trials=6, db=db, seed=0)
    assert pools.used[-1].submitted[:2] == points
    assert [(p.source, p.params) for p in result.warm_start] == [("family", p) for p in points]
    assert all(p.ratio_to_best is not None and p.ratio_to_best >= 1.0 for p in result.warm_start), result.warm_start
    off = tuner.tune("toy", "2,4,2048,64", "fp16", trials=3, db=db, seed=0, warm_start=0)
    assert off.warm_start == () and pools.used[-1].submitted[:2] != points


def test_a_study_begun_without_starting_points_gets_the_unmeasured_ones_on_resume(toy, db, pools, monkeypatch):
    first = tuner.tune("toy", "2,4,1024,64", "fp16", trials=4, db=db, seed=0)
    measured = pools.used[-1].submitted[0]
    fresh = dict(BLOCK_M=16, BLOCK_N=16, WARPS=1, STAGES=1)
    monkeypatch.setattr(toy, "starting_points", lambda problem, device: [dict(measured), fresh], raising=False)
    tuner.tune("toy", "2,4,1024,64", "fp16", trials=6, db=db, seed=0)
    assert pools.used[-1].submitted[0] == fresh  # the measured point is not measured again
    assert measured not in pools.used[-1].submitted and first.best is not None
