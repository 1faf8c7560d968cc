"""The coordinator end to end: real Optuna, real storage (SQLite file), a fake pool."""

from __future__ import annotations

from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState

import tuner
from storage import open_repository, params_key
from tuner_doubles import (
    GPU_FAILURES,
    PROBLEM,
    FakeClock,
    FakePool,
    failure_of,
    latency_ms,
    valid_configs,
)
from tuner import api, search


def _tune(**kwargs):
    options = {"sampler": "tpe", "seed": 0}
    options.update(kwargs)
    return tuner.tune("toy", *PROBLEM, **options)


def _optuna_trials(db, name):
    return optuna.load_study(study_name=name, storage=db).get_trials(deepcopy=False)


def test_trial_budget_records_every_measured_trial(toy, db, pools):
    result = _tune(trials=20, db=db)
    pool = pools.used[0]
    assert result.status == "finished" and result.reason == "20 trials measured"
    assert result.measured == 20 == len(pool.submitted)
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    assert study.status == "finished"
    stored = repo.trials(study.id)
    assert len(stored) == 20
    for trial in stored:
        assert (trial.status == "ok") == (failure_of(trial.params) is None)
        if trial.status == "ok":
            assert trial.median_ms == pytest.approx(latency_ms(trial.params))
            flops = toy.flops(toy.parse_problem(*PROBLEM))
            assert trial.tflops == pytest.approx(flops / (trial.median_ms / 1e3) / 1e12)
            assert trial.registers == 96 and trial.repetitions == 50
            assert trial.gpu_state == {"sm_mhz": 1980} and not trial.replayed
            assert trial.toolkit == "nvcc 13.0.88"
    assert all(t.state == TrialState.COMPLETE for t in _optuna_trials(db, result.study))


def test_invalid_configs_are_told_without_compiling_and_do_not_count(toy, db, pools):
    result = _tune(trials=15, db=db, sampler="random")
    pool = pools.used[0]
    problem = toy.parse_problem(*PROBLEM)
    assert all(toy.check(p, problem, pool.limits) is None for p in pool.submitted)
    assert result.invalid > 0 and result.measured == 15
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    assert len(repo.trials(study.id)) == 15  # storage holds measured trials only
    # so does Optuna's study in the database: the sampler was told the rejected ones in memory
    space = search.SearchSpace(toy.params)
    durable = _optuna_trials(db, result.study)
    assert len(durable) == 15 and all(t.user_attrs.get("failure") != "invalid" for t in durable)
    assert sorted(params_key(space.decode(t.params)) for t in durable) == sorted(
        params_key(p) for p in pool.submitted)


def test_failures_are_stored_with_their_kind_and_never_become_best(toy, db, tuned):
    result = tuned.result
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    failed = [t for t in repo.trials(study.id) if t.status == "failed"]
    assert {t.failure for t in failed} == set(GPU_FAILURES)
    assert all(t.failure == failure_of(t.params) and t.reason for t in failed)
    assert all(t.tflops is None for t in failed)
    ok = [t for t in repo.trials(study.id) if t.status == "ok"]
    fastest = min(ok, key=lambda t: t.median_ms)
    assert min(latency_ms(t.params) for t in failed) < fastest.median_ms  # failures were faster
    assert result.best.params == fastest.params and result.best.median_ms == fastest.median_ms
    assert failure_of(tuner.best("toy", *PROBLEM, db=db).params) is None


def test_grid_covers_the_valid_space_once_and_stops(toy, db, tuned):
    result, submitted = tuned.result, tuned.pool.submitted
    expected = {params_key(c) for c in valid_configs(toy)}
    assert Counter(params_key(p) for p in submitted) == Counter(expected)  # each exactly once
    assert result.reason == f"every valid config ({len(expected)}) measured"
    assert result.invalid == 0  # the grid walks the valid configs alone


def test_tpe_proposes_new_configs_before_repeats(toy, db, pools):
    n_valid = len(valid_configs(toy))
    result = _tune(trials=n_valid // 2, db=db)
    assert result.measured == n_valid // 2 and result.reused == 0


def test_duplicates_are_never_measured_again(toy, db, pools):
    # Random search over a small space repeats itself: repeats are answered without the GPU.
    n_valid = len(valid_configs(toy))
    result = _tune(trials=n_valid // 2, db=db, sampler="random")
    submitted = pools.used[0].submitted
    keys = [params_key(p) for p in submitted]
    assert len(keys) == len(set(keys)) == n_valid // 2
    assert result.reused > 0
    for trial in _optuna_trials(db, result.study):
        assert trial.state == TrialState.COMPLETE
        params = trial.params
        expected = float("inf") if failure_of(params) or toy.check(
            params, toy.parse_problem(*PROBLEM), pools.used[0].limits) else latency_ms(params)
        assert trial.value == pytest.approx(expected)


def test_rerun_of_a_finished_study_measures_nothing(toy, db, pools):
    first = _tune(trials=12, db=db)
    second = _tune(trials=12, db=db)
    assert second.study == first.study
    assert second.previous == 12 and second.measured == 0
    assert pools.used[1].submitted == []


def test_time_budget_stops_asking(toy, db):
    clock = FakeClock()
    pool = FakePool(per_poll=1, seconds_per_result=1.0, clock=clock)
    fam = toy
    problem = fam.parse_problem(*PROBLEM)
    with open_repository(db) as repo:
        name, outcome, _ = api._run_study(
            fam, problem, pool, repo, db, space=search.SearchSpace(fam.params), sampler="random",
            seed=1, trials=None, time_budget=10.0, replay=None, clock=clock, lookahead=3,
        )
    assert outcome.status == "finished" and outcome.reason == "time budget of 10s spent"
    assert 10 <= outcome.measured <= 10 + 3
    assert outcome.measured < len(valid_configs(toy))


def test_interrupt_then_resume_continues_the_same_study(toy, db, pools):
    pools.queued.append(FakePool(per_poll=1, interrupt_after_polls=5))
    first = _tune(trials=25, db=db)
    assert first.status == "interrupted" and 0 < first.measured < 25
    repo = open_repository(db)
    assert next(s for s in repo.studies() if s.name == first.study).status == "interrupted"
    trials = _optuna_trials(db, first.study)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert waiting  # what was in flight is queued again

    second = _tune(trials=25, db=db)
    assert second.study == first.study and second.status == "finished"
    assert second.previous == first.measured and first.measured + second.measured == 25
    first_keys = {params_key(p) for p in pools.used[0].submitted[: first.measured]}
    second_keys = [params_key(p) for p in pools.used[1].submitted]
    assert not first_keys & set(second_keys)
    requeued = {params_key(t.system_attrs["fixed_params"]) for t in waiting}
    assert requeued <= set(second_keys[: len(requeued)])  # measured first
    assert next(s for s in repo.studies() if s.name == first.study).status == "finished"


def test_resume_after_a_kill_settles_running_trials(toy, db, pools):
    first = _tune(trials=5, db=db)
    # A killed run leaves trials RUNNING: one whose result was stored, one never measured.
    repo = open_repository(db)
    record = next(s for s in repo.studies() if s.name == first.study)
    space = search.SearchSpace(toy.params)
    study = optuna.load_study(study_name=first.study, storage=db)
    stored = [t for t in repo.trials(record.id) if t.status == "ok"][0]
    done = {params_key(t.params) for t in repo.trials(record.id)}
    fresh = next(c for c in valid_configs(toy) if params_key(c) not in done)
    for params in (stored.params, fresh):
        study.enqueue_trial(space.encode(params))
        study.ask(space.distributions)
    assert len(search.orphans(study)) == 2

    second = _tune(trials=8, db=db)
    trials = _optuna_trials(db, first.study)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    told = [t for t in trials if t.params == stored.params and t.state == TrialState.COMPLETE]
    assert all(t.value == stored.median_ms for t in told) and len(told) >= 2
    assert params_key(pools.used[1].submitted[0]) == params_key(fresh)
    assert second.previous == 5 and second.measured == 3


def test_many_asks_without_a_new_config_stop_the_study(toy, db):
    pool = FakePool(per_poll=1)
    problem = toy.parse_problem(*PROBLEM)
    with open_repository(db) as repo:
        _, outcome, _ = api._run_study(
            toy, problem, pool, repo, db, space=search.SearchSpace(toy.params), sampler="random",
            seed=3, trials=None, time_budget=None, replay=None, max_idle_asks=3, lookahead=1,
        )
    assert outcome.reason == "3 asks in a row brought no new config"
    assert outcome.measured == len(pool.submitted) < len(valid_configs(toy))


def test_replayed_studies_are_kept_apart(toy, db, pools):
    real = _tune(trials=3, db=db)
    replayed = _tune(trials=3, db=db, replay="landscape.json")
    assert replayed.study == real.study + "/replay" and replayed.previous == 0
    summaries = {s.name: s for s in open_repository(db).studies()}
    assert summaries[replayed.study].replay and not summaries[real.study].replay


def test_the_early_stop_bar_follows_the_best_so_far(toy, db, pools):
    bars = []

    class BarPool(FakePool):
        def set_abort_above(self, ms):
            bars.append(ms)

    pools.queued.append(BarPool())
    result = tuner.tune("toy", *PROBLEM, trials=15, db=db, seed=0)
    assert bars and all(a >= b for a, b in zip(bars, bars[1:]))  # only ever lowered
    assert bars[-1] == pytest.approx(1.5 * result.best.median_ms)

    pools.queued.append(BarPool())
    bars.clear()
    full = tuner.tune("toy", "2,4,4096,64", "fp16", trials=8, db=db, seed=0, early_stop=False)
    assert full.measured == 8 and bars == []  # every candidate timed in full


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("owner_is_running", [True, False])
def test_a_trial_of_a_running_coordinator_is_left_to_it(toy, db, pools, owner_is_running):
    """Several machines may share one study: a RUNNING trial whose coordinator still runs is
    not re-queued by another; one whose coordinator is gone is."""
    import os
    import socket

    first = _tune(trials=3, db=db)
    done = {params_key(t.params) for t in tuner.show(first.study, db=db).trials}
    fresh = next(c for c in valid_configs(toy) if params_key(c) not in done)
    study = optuna.load_study(study_name=first.study, storage=db)
    study.enqueue_trial(search.SearchSpace(toy.params).encode(fresh))
    orphan = study.ask(search.SearchSpace(toy.params).distributions)
    pid = os.getppid() if owner_is_running else _dead_pid()
    orphan.set_user_attr("owner", f"{socket.gethostname()}:{pid}")

    _tune(trials=5, db=db)
    state = optuna.load_study(study_name=first.study, storage=db).trials[orphan.number].state
    submitted = [params_key(p) for p in pools.used[-1].submitted]
    if owner_is_running:
        assert state == TrialState.RUNNING and params_key(fresh) not in submitted
    else:
        assert state == TrialState.FAIL and submitted[0] == params_key(fresh)


def test_owner_liveness():
    import os
    import socket
    from datetime import datetime, timedelta

    here = socket.gethostname()
    now = datetime(2026, 11, 22, 12, 0)
    assert search.owner_alive(f"{here}:{os.getppid()}", now, now)
    assert not search.owner_alive(f"{here}:{os.getpid()}", now, now)  # this process: settled
    assert not search.owner_alive(f"{here}:{_dead_pid()}", now, now)
    assert search.owner_alive("elsewhere:12", now - timedelta(minutes=5), now)
    assert not search.owner_alive("elsewhere:12", now - timedelta(hours=2), now)
    assert not search.owner_alive(None, now, now)
