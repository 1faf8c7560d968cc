"""Several GPUs' timings made one set: the loop on two emulated GPUs of one model, the second 4%
slower (drifting, with noise), real Optuna and storage (``TwoGpuPool`` in tuner_doubles)."""

from __future__ import annotations

import json
import statistics

import pytest

import tuner
import tuner.study.loop
from storage import open_repository, params_key
from tuner.cli.commands import main
from tuner.study.normalize import GpuScale
from tuner_doubles import GPUS, PROBLEM, TwoGpuPool, clocks_of, failure_of, latency_ms, noise

A = {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 4, "STAGES": 1}  # the fastest config: 1.10 ms
B = {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 2, "STAGES": 1}  # 1.12 ms here: 1.8% behind A


def near_tie(params) -> float:
    """The toy landscape, with B moved to 1.8% behind A (a 4% slower GPU turns them round)."""
    return 1.12 if dict(params) == B else latency_ms(params)


def a_slow_b_fast(params, ticket) -> int:
    """A lands on the slow GPU, B on the fast one, the rest alternately."""
    return 1 if params == A else 0 if params == B else ticket % 2


def _tune(db, pools, pool, **options):
    pools.queued.append(pool)
    result = tuner.tune("toy", *PROBLEM, sampler="grid", db=db, seed=0, **{"retime": 0, **options})
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    return result, repo, study, repo.trials(study.id)


def test_normalized_medians_agree_within_1_percent_and_raw_ones_are_kept(toy, db, pools):
    pool = TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast)
    result, repo, study, trials = _tune(db, pools, pool)
    assert result.status == "finished"
    raw = {params_key(p): ms for _, p, ms in pool.timed}
    ok = [t for t in trials if t.ok]
    assert {t.gpu_index for t in ok} == {0, 1} and all(t.gpu_uuid == GPUS[t.gpu_index]["uuid"] for t in ok)
    for t in ok:
        assert t.median_ms == raw[t.key]  # stored as measured, never altered
        true = near_tie(t.params)
        if t.gpu_index == 0:  # the reference: its own drift followed too (none here but the noise)
            assert t.gpu_ratio == pytest.approx(1.0, abs=0.005)
            assert t.normalized_ms == pytest.approx(t.median_ms * t.gpu_ratio)
            assert abs(t.normalized_ms / true - 1) < 0.01
        else:
            assert t.median_ms / true == pytest.approx(1.04, abs=0.006)  # raw: 3.4-4.6% slow
            assert t.normalized_ms == pytest.approx(t.median_ms * t.gpu_ratio)
            assert abs(t.normalized_ms / true - 1) < 0.01  # normalized: within 1%
    # results of GPU 1 that came back before its first round waited for it: every one has a ratio
    assert all(t.gpu_ratio is not None for t in ok) and len(ok) > 40
    for t in trials:
        state = dict(t.gpu_state or {})
        anchor_ms, spread = state.pop("anchor_ms", None), state.pop("anchor_spread", None)
        assert state.pop("anchor", None) == (None if anchor_ms is None else params_key(pool.calibration_log[0][2]))
        assert state == ({} if not t.ok else {**clocks_of(t.params), "name": GPUS[0]["name"]})
        if t.ok and t.gpu_ratio is not None and anchor_ms is not None:  # the anchor's time then, and its drift
            standard = next(ms for _, gpu, _, ms in pool.calibration_log if gpu == 0)
            assert t.gpu_ratio == pytest.approx(standard / anchor_ms)
            assert spread is None or 0 <= spread < 0.01


def test_the_winner_is_not_the_config_that_landed_on_the_faster_gpu(toy, db, pools):
    """A (1.10 ms) ran on the slow GPU (1.144 raw), B (1.12 ms) on the fast one: by raw medians
    B would win; the normalized ones make A the best, for the sampler, the progress and storage."""
    pool = TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast)
    result, repo, study, trials = _tune(db, pools, pool)
    by_key = {t.key: t for t in trials}
    a, b = by_key[params_key(A)], by_key[params_key(B)]
    assert (a.gpu_index, b.gpu_index) == (1, 0) and a.median_ms > b.median_ms  # raw: B is faster
    assert a.normalized_ms < b.normalized_ms
    assert result.best.params == A and result.best.median_ms == pytest.approx(a.normalized_ms)
    assert study.best_median_ms == pytest.approx(a.normalized_ms)
    assert pool.incumbents[-1] == A  # the incumbent every GPU re-times
    rounds = {}
    for number, gpu, params, _ in pool.calibration_log:  # each round: one config, every GPU
        rounds.setdefault(number, []).append((gpu, params_key(params)))
    assert len(rounds) >= 5
    for number, timed in rounds.items():
        assert sorted(g for g, _ in timed) == [0, 1] and len({k for _, k in timed}) == 1


def test_the_final_retiming_runs_on_the_reference_gpu_only(toy, db, pools):
    pool = TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast)
    result, repo, study, trials = _tune(db, pools, pool, retime=5)
    assert pool.retimed_on == [0] and len(pool.retimed) == 1
    assert params_key(A) in {params_key(p) for p in pool.retimed[0]}
    records = repo.retimes(study.id)
    assert all(r.gpu_state["gpu"] == GPUS[0] for r in records)
    assert result.best.params == A and result.best.retime is not None


def test_the_same_configs_timed_on_both_gpus_agree_within_1_percent_once_normalized(toy, db, pools):
    """What docs/scripts/multigpu_check.py measures on two GPUs: 10 configs timed on each, the
    second's medians scaled by the ratio the study ended with."""
    pool = TwoGpuPool()
    result, repo, study, trials = _tune(db, pools, pool)
    ratio = [t for t in trials if t.gpu_index == 1 and t.gpu_ratio is not None][-1].gpu_ratio
    configs = [t.params for t in trials if t.ok][:10]
    first = [pool.ms_on(0, p) for p in configs]
    second = [pool.ms_on(1, p) for p in configs]
    before = [s / f - 1 for f, s in zip(first, second)]
    after = [s * ratio / f - 1 for f, s in zip(first, second)]
    assert min(before) > 0.03 and max(abs(d) for d in after) < 0.01


def test_one_gpu_changes_nothing(toy, db, pools):
    pool = TwoGpuPool(gpus=1)
    result, repo, study, trials = _tune(db, pools, pool, retime=5)
    assert pool.incumbents == [] and pool.calibration_log == []  # no extra timings
    ok = [t for t in trials if t.ok]
    assert all(t.normalized_ms is None and t.gpu_ratio is None for t in trials)
    assert all((t.gpu_index, t.gpu_uuid) == (0, "GPU-fake-0") for t in trials)
    best = min(ok, key=lambda t: t.median_ms)
    assert study.best_median_ms == best.median_ms and pool.retimed_on == [0]
    assert {t.number for t in trials if failure_of(t.params)} == {t.number for t in trials if not t.ok}


def test_show_prints_each_trials_gpu_and_its_normalized_median(toy, db, pools, capsys):
    result, repo, study, trials = _tune(db, pools, TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast))
    assert main(["show", result.study, "--json", "--db", db]) == 0
    shown = {params_key(t["params"]): t for t in json.loads(capsys.readouterr().out)["trials"]}
    a = shown[params_key(A)]
    assert (a["gpu_index"], a["gpu_uuid"]) == (1, "GPU-fake-1") and a["normalized_ms"] < a["median_ms"]
    assert a["gpu_state"]["before"]["power_w"] == 300 and a["gpu_state"]["after"]["temperature_c"] == 44
    assert main(["show", result.study, "--db", db]) == 0
    out = capsys.readouterr().out
    assert "measured on GPUs 0, 1; normalized to GPU 0" in out
    line = next(x for x in out.splitlines() if x.strip().startswith(f"#{a['number']} "))
    assert "GPU 1, SM 1764->1764 MHz, 42->44 C, 300->404 W" in line and "ms normalized (x0.9" in line


def test_a_resumed_study_tells_the_sampler_the_normalized_medians(toy, db, pools):
    _tune(db, pools, TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast), trials=30)
    pool = TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast)
    result, repo, study, trials = _tune(db, pools, pool, trials=50)
    assert result.previous == 30 and len(trials) == 50
    assert pool.incumbents and pool.incumbents[0] == min(
        (t for t in trials[:30] if t.ok), key=lambda t: t.normalized_ms).params


# -- the ratios ----------------------------------------------------------------------------------
def test_a_gpus_factor_is_the_standard_over_its_own_recent_anchor_timings():
    scale = GpuScale("ref")
    assert scale.ratio("ref") == 1.0 and scale.ratio("other") is None  # the reference: the standard's
    assert scale.normalized("other", 2.0) == (2.0, None)
    scale.observe(1, "other", 1.04)  # no standard yet: the reference has not timed the anchor
    assert scale.ratio("other") is None
    scale.observe(1, "ref", 1.00)  # the standard: 1.00 ms
    assert scale.standard == 1.0 and scale.ratio("other") == pytest.approx(1 / 1.04)
    assert scale.normalized("other", 2.08) == pytest.approx((2.0, 1 / 1.04))
    scale.observe(2, "ref", 1.10)  # the reference drifts too: its own trials follow
    assert scale.ratio("ref") == pytest.approx(1 / statistics.median([1.00, 1.10]))
    assert scale.standard == 1.0  # the standard stays the reference's first timing


def test_a_gpus_factor_follows_its_drift_with_the_median_of_its_latest_timings():
    scale = GpuScale("ref", window=3)
    scale.observe(1, "ref", 1.0)
    drifting = [1.00, 1.02, 1.30, 1.04, 1.06, 1.08, 1.10]  # one odd timing, then 10% slower
    for number, ms in enumerate(drifting, 1):
        scale.observe(number, "other", ms)
        window = drifting[max(0, number - 3):number]
        assert scale.ratio("other") == pytest.approx(1 / statistics.median(window))
        if len(window) > 1:
            assert scale.spread("other") == pytest.approx((max(window) - min(window)) / (2 * statistics.median(window)))
    assert scale.ratio("other") == pytest.approx(1 / 1.08) and scale.spread("other") == pytest.approx(0.02 / 1.08)
    scale.observe(7, "other", 2.0)  # timed twice in one round (a replaced worker): the first counts
    assert scale.ratio("other") == pytest.approx(1 / 1.08)
    assert scale.ratios() == {"ref": 1.0, "other": pytest.approx(1 / 1.08)}
    assert scale.spread("ref") is None  # one timing: no drift to tell


def test_noise_is_small_and_deterministic():
    values = [noise(str(i), g) for i in range(200) for g in (0, 1)]
    assert max(abs(v - 1) for v in values) <= 0.002 + 1e-12 and noise("x", 1) == noise("x", 1)


@pytest.mark.optuna_copy
def test_the_optuna_copy_has_the_values_the_sampler_had(toy, db, pools, tmp_path):
    import optuna

    result, repo, study, trials = _tune(db, pools, TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast))
    target = str(tmp_path / "study.log")
    tuner.export_optuna(result.study, target, db=db)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(target))
    copied = {t.user_attrs["number"]: t for t in optuna.load_study(study_name=result.study,
                                                                   storage=storage).trials}
    for t in trials:
        if t.ok:
            assert copied[t.number].value == t.normalized_ms
            assert copied[t.number].user_attrs["median_ms"] == t.median_ms
            assert copied[t.number].user_attrs["gpu_index"] == t.gpu_index


def test_a_result_waits_for_its_gpus_first_ratio_and_is_stored_normalized(toy, db, pools):
    """GPU 1's first results come back before its first round: they are told and stored once the
    round is back, normalized; with no round coming (calibrations never answered) the loop still
    ends, keeping their raw medians, no ratio."""
    pool = TwoGpuPool(per_poll=4)
    result, repo, study, trials = _tune(db, pools, pool, trials=12)
    first = [t for t in trials if t.ok and t.gpu_index == 1][:2]
    assert first and all(t.gpu_ratio is not None for t in first)

    silent = TwoGpuPool(per_poll=4)
    silent.calibrations = lambda: []  # the rounds never come back
    result, repo, study, trials = _tune(f"{db}.2", pools, silent, trials=12)
    assert result.status == "finished" and len(trials) == 12
    slow = [t for t in trials if t.ok and t.gpu_index == 1]
    assert slow and all(t.gpu_ratio is None and t.normalized_ms == t.median_ms for t in slow)


class LateRounds(TwoGpuPool):
    """The rounds' timings come back ``late`` polls after they were timed, on their way meanwhile
    (``calibrating``), as a real pool's incumbent on a busy GPU."""

    def __init__(self, *, late: int, **options) -> None:
        super().__init__(**options)
        self.late, self._on_their_way = late, []

    def poll(self, timeout):
        results = super().poll(timeout)
        self._on_their_way = [[n - 1, c] for n, c in self._on_their_way] + [[self.late, c] for c in self._calibrations]
        self._calibrations = []
        return results

    def calibrations(self):
        out = [c for n, c in self._on_their_way if n <= 0]
        self._on_their_way = [[n, c] for n, c in self._on_their_way if n > 0]
        return out

    def calibrating(self) -> bool:  # a round due on a GPU (sent to it, in a real pool) or timed, not back
        return bool(self._on_their_way) or any(self.schedule.due(done) is not None for done in self.calibrated)


def test_a_held_result_waits_for_its_gpus_round_while_the_round_is_on_its_way(toy, db, pools):
    """Nothing else in flight, but GPU 1's first round not back yet: its results wait for it (a
    two-GPU study stored a trial of GPU 1 with no ratio, one run in seven, before)."""
    pool = LateRounds(late=4, per_poll=8)
    result, repo, study, trials = _tune(db, pools, pool, trials=6)
    ok = [t for t in trials if t.ok]
    assert result.status == "finished" and {t.gpu_index for t in ok} == {0, 1}
    assert all(t.gpu_ratio is not None for t in ok)


def test_a_study_whose_first_results_come_from_the_other_gpu_starts_its_rounds_from_them(toy, db, pools):
    """Every config on GPU 1 until GPU 0 has measured nothing: the incumbent comes from a held
    result, the rounds start, and GPU 1's results are normalized."""
    pool = TwoGpuPool(gpu_of=lambda params, ticket: 1 if ticket < 6 else ticket % 2)
    result, repo, study, trials = _tune(db, pools, pool, trials=10)
    ok = [t for t in trials if t.ok]
    assert pool.incumbents and all(t.gpu_ratio is not None for t in ok)
    assert {t.gpu_index for t in ok if t.number < 6} == {1}


def test_tune_says_which_gpu_the_retiming_ran_on(toy, db, pools, capsys):
    pools.queued.append(TwoGpuPool(latency=near_tie, gpu_of=a_slow_b_fast))
    assert main(["tune", "toy", "--shape", PROBLEM[0], "--dtype", PROBLEM[1], "--trials", "20",
                 "--db", db, "--sampler", "grid"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("re-timed"))
    assert line.startswith("re-timed  top 5 interleaved on GPU 0 (30 rounds): winner #")


# -- drift -----------------------------------------------------------------------------------------
CLOSE = [{"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 2, "STAGES": 1}, {"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 1},
         {"BLOCK_M": 64, "BLOCK_N": 16, "WARPS": 4, "STAGES": 1}, {"BLOCK_M": 32, "BLOCK_N": 32, "WARPS": 4, "STAGES": 1},
         {"BLOCK_M": 128, "BLOCK_N": 32, "WARPS": 4, "STAGES": 1}, {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 1, "STAGES": 1}]


def crowded(params) -> float:
    """The toy landscape with six configs 1.5-4% behind A (1.10 ms): a 10% drift reorders them."""
    params = dict(params)
    if params in CLOSE:
        return 1.10 * (1.015 + 0.005 * CLOSE.index(params))
    return latency_ms(params)


def _drifting_wins(db, pools, seeds: int) -> int:
    """Studies of the crowded landscape whose second GPU slows 10% over the run: how many end
    with A, the true best, as the stored winner (the final re-timing runs on GPU 0, at true times).
    Each in a database of its own, copied from one made once (not migrated study by study)."""
    import sqlite3

    template = db.replace("tuner.db", "drift_template.db")
    open_repository(template).close()
    wins = 0
    for seed in range(seeds):
        pools.queued.append(TwoGpuPool(latency=crowded, slowdown=1.0, drift=0.10, drift_trials=40))
        url = db.replace("tuner.db", f"drift{seed}.db")
        with sqlite3.connect(template.removeprefix("sqlite:///")) as source, \
                sqlite3.connect(url.removeprefix("sqlite:///")) as target:
            source.backup(target)
        tuner.tune("toy", *PROBLEM, sampler="random", db=url, seed=seed, warm_start=0, trials=60, retime=3)
        wins += tuner.best("toy", *PROBLEM, db=url).params == A
    return wins


def test_a_gpu_slowing_10_percent_over_the_run_does_not_cost_the_true_best(toy, db, pools, monkeypatch):
    """Each GPU's trials normalized by its own timings of the anchor close in time: the true best
    wins in 19 of 20 seeds or more, though the drifting GPU's raw medians grow 10% over the run;
    ranked by raw medians, the same studies lose it in 4 (the final re-timing of the top 3 never
    sees it)."""
    assert _drifting_wins(db, pools, 20) >= 19
    monkeypatch.setattr(tuner.study.loop, "gpu_scale", lambda pool: None)
    assert _drifting_wins(db.replace("tuner.db", "raw_tuner.db"), pools, 20) <= 16


def _throttled_errors(db, pools, *, paired: bool) -> list[float]:
    """GPU 1's trials' errors, normalized (those timed beside the anchor only, where ``paired``:
    the first, measured before the anchor was chosen, are normalized by the rounds)."""
    pool = TwoGpuPool(throttle=0.10, paired=paired, slowdown=1.0)
    _, _, _, trials = _tune(db, pools, pool)
    return [t.normalized_ms / latency_ms(t.params) - 1 for t in trials
            if t.ok and t.gpu_index == 1 and t.normalized_ms is not None
            and (not paired or "anchor_ratio" in (t.gpu_state or {}))]


def test_trials_timed_beside_the_anchor_stay_within_1_percent_when_each_timing_is_throttled(toy, db, pools):
    """GPU 1's every timing up to 10% slow, each its own draw: normalized by the anchor timed in
    rounds, its trials land up to 10% off; timed beside the anchor under the same clocks, each
    stays within 1% of its true time, stored with the ratio and its spread."""
    rounds = _throttled_errors(db, pools, paired=False)
    assert max(abs(e) for e in rounds) > 0.03
    paired = _throttled_errors(db.replace("tuner.db", "paired.db"), pools, paired=True)
    assert len(paired) > 20 and max(abs(e) for e in paired) < 0.01
    repo = open_repository(db.replace("tuner.db", "paired.db"))
    study = repo.studies()[0]
    beside = [t for t in repo.trials(study.id) if t.ok and "anchor_ratio" in (t.gpu_state or {})]
    assert beside and all(t.gpu_state["anchor_ratio_iqr"] > 0 for t in beside)
    for t in beside:  # the interval is the ratio's spread (0.4%) and the 1% floor, not the raw IQR
        assert t.interval_ms == pytest.approx(t.normalized_ms * (0.002 ** 2 + 0.01 ** 2) ** 0.5, rel=1e-6)


def test_a_landscape_of_a_paired_study_keeps_its_normalized_values_and_intervals(toy, db, pools, tmp_path):
    """``tuner landscape`` of a two-GPU study whose trials were timed beside the anchor: each
    entry's median is the stored normalized median, and the interval a replay derives from it
    is the stored one."""
    from storage import interval_ms
    from workers.replay import load_landscape

    result, repo, study, trials = _tune(db, pools, TwoGpuPool(throttle=0.10, paired=True))
    path = tuner.record_landscape(result.study, tmp_path / "paired.json", db=db)
    land = {params_key(p): m for p, m in load_landscape(path).entries}
    beside = [t for t in trials if t.ok and "anchor_ratio" in (t.gpu_state or {})]
    assert len(beside) > 20
    for t in beside:
        m = land[t.key]
        assert m.timing.median_ms == pytest.approx(t.normalized_ms, rel=1e-9)
        assert interval_ms(m.timing.median_ms, m.timing.iqr_ms, m.timing.repetitions) == pytest.approx(
            t.interval_ms, rel=1e-6)
