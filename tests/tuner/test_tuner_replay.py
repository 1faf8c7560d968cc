"""A whole study through real Ray actors, real Optuna and real storage, on GPU measurements
recorded on an H200 (tests/data: every valid config of one problem, timed by the GPU workers)."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

import tuner
from tuner_doubles import LANDSCAPE, run_cli
from workers.replay import load_landscape

PROBLEM = ("attention", "2,8,1024,64", "fp16", {"causal": True})


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('replay') / 'tuner.db'}"
    result = tuner.tune(*PROBLEM, trials=30, replay=LANDSCAPE, db=db, seed=1)
    return db, result


def test_replayed_study_measures_through_the_pool_and_stores_every_trial(replayed):
    db, result = replayed
    landscape = load_landscape(LANDSCAPE)
    recorded = landscape.lookup()
    assert result.status == "finished" and result.measured == 30
    assert result.study.endswith("/replay") and result.device == landscape.device.name
    trials = tuner.show(result.study, db=db).trials
    assert len(trials) == 30 and all(t.replayed for t in trials)
    for trial in trials:  # each stored number is the one recorded on the GPU for that config
        answer = recorded[json.dumps(trial.params, sort_keys=True)]
        assert trial.status == ("ok" if answer.ok else "failed")
        if answer.ok:
            assert trial.median_ms == answer.timing.median_ms
            assert trial.registers == answer.resources.registers
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 30  # none measured twice


def test_the_optuna_study_holds_every_result_written_by_its_actor(replayed):
    db, result = replayed
    stored = {t.number: t for t in tuner.show(result.study, db=db).trials}
    durable = optuna.load_study(study_name=result.study, storage=db).get_trials(deepcopy=False)
    assert {t.number for t in durable} == set(stored)
    for trial in durable:
        expected = stored[trial.number].median_ms if stored[trial.number].status == "ok" else float("inf")
        assert trial.state == TrialState.COMPLETE and trial.value == expected


def test_replayed_winner_is_the_fastest_stored_and_is_marked(replayed):
    db, result = replayed
    winner = tuner.best(*PROBLEM, db=db)
    ok = [t for t in tuner.show(result.study, db=db).trials if t.status == "ok"]
    assert winner.median_ms == min(t.median_ms for t in ok) and winner.replayed
    landscape_best = min(m.timing.median_ms for _, m in load_landscape(LANDSCAPE).entries if m.ok)
    assert winner.median_ms <= 1.5 * landscape_best  # TPE gets near the best of 384 in 30 trials


def test_resuming_a_finished_replay_measures_nothing_new(replayed):
    db, result = replayed
    again = tuner.tune(*PROBLEM, trials=30, replay=LANDSCAPE, db=db, seed=1)
    assert again.study == result.study and again.measured == 0 and again.previous == 30


def test_cli_replays_and_says_so(replayed, tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    done = run_cli("tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                   "--trials", "8", "--replay", str(LANDSCAPE), "--db", db, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "/replay" in done.stdout and "8 measured" in done.stdout
    best = run_cli("best", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                   "--db", db, cwd=tmp_path, timeout=120)
    assert best.returncode == 0 and "(replayed)" in best.stdout and "H200" in best.stdout


def test_the_same_study_runs_on_sqlite_and_postgresql(url):
    """Optuna's tables and ours in one database of each backend; resume finds both again."""
    first = tuner.tune(*PROBLEM, trials=6, replay=LANDSCAPE, db=url, seed=2)
    assert first.measured == 6 and first.best is not None
    second = tuner.tune(*PROBLEM, trials=10, replay=LANDSCAPE, db=url, seed=2)
    assert second.study == first.study and second.previous == 6 and second.measured == 4
    trials = tuner.show(first.study, db=url).trials
    assert [t.number for t in trials] == sorted(t.number for t in trials) and len(trials) == 10
    assert tuner.best(*PROBLEM, db=url).median_ms == min(t.median_ms for t in trials if t.status == "ok")
    assert [s.name for s in tuner.studies(db=url)] == [first.study]
