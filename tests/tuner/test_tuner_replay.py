"""A whole study through real Ray actors, real Optuna (in memory) and real storage, on GPU measurements
recorded on an H200 (tests/data: every valid config of one problem, timed by the GPU workers)."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

import tuner
from tuner.cli.commands import main
from tuner_doubles import LANDSCAPE
from workers.replay import load_landscape

PROBLEM = ("attention", "2,8,1024,64", "fp16", {"causal": True})
pytestmark = pytest.mark.usefixtures("module_ray")  # one Ray for the module's studies


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


@pytest.mark.parametrize("target", ["study.log", "sqlite:///{tmp}/optuna.db"])
def test_show_copies_the_study_to_an_optuna_storage_for_the_dashboard(replayed, tmp_path, target):
    db, result = replayed
    target = target.format(tmp=tmp_path) if "://" in target else str(tmp_path / target)
    assert main(["show", result.study, "--db", db, "--optuna", target]) == 0
    stored = {t.number: t for t in tuner.show(result.study, db=db).trials}
    storage = (target if "://" in target else optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(target)))
    copied = optuna.load_study(study_name=result.study, storage=storage).get_trials(deepcopy=False)
    assert sorted(t.user_attrs["number"] for t in copied) == sorted(stored)
    for trial in copied:
        mine = stored[trial.user_attrs["number"]]
        assert trial.state == (TrialState.COMPLETE if mine.ok else TrialState.FAIL)
        assert trial.value == (mine.median_ms if mine.ok else None)
        assert trial.params == {k: v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)
                                for k, v in mine.params.items()}
    with pytest.raises(tuner.UsageError, match="already"):  # never written over
        tuner.export_optuna(result.study, target, db=db)


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


def test_cli_replays_and_says_so(replayed, tmp_path, capsys):
    """The commands in this process (``python -m tuner`` runs them in one of its own in
    test_sigterm_mid_study_ends_it_as_ctrl_c_and_the_same_command_finishes_it and
    tests/tuner/test_tuner_concurrency.py)."""
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    code = main(["tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                 "--trials", "8", "--replay", str(LANDSCAPE), "--db", db])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "/replay" in out.out and "8 measured" in out.out
    assert main(["best", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal", "--db", db]) == 0
    best = capsys.readouterr().out
    assert "(replayed)" in best and "H200" in best


def test_the_same_study_runs_on_sqlite_and_postgresql(url):
    """Optuna's tables and ours in one database of each backend; resume finds both again."""
    first = tuner.tune(*PROBLEM, trials=6, replay=LANDSCAPE, db=url, seed=2)
    assert first.measured == 6 and first.best is not None
    second = tuner.tune(*PROBLEM, trials=10, replay=LANDSCAPE, db=url, seed=2)
    assert second.study == first.study and second.previous == 6 and second.measured == 4
    trials = tuner.show(first.study, db=url).trials
    assert [t.number for t in trials] == sorted(t.number for t in trials) and len(trials) == 10
    best, fastest = tuner.best(*PROBLEM, db=url), min(t.median_ms for t in trials if t.status == "ok")
    # the fastest, or one within its noise that won the tie (fewer registers, ...)
    assert best.median_ms == fastest or (best.retime.gpu_state.get("tied") and
                                         best.median_ms == pytest.approx(fastest, abs=2 * best.interval_ms))
    assert [s.name for s in tuner.studies(db=url)] == [first.study]


def test_a_replayed_study_resumes_where_it_stopped(replayed):
    """Last in this module: it adds trials to the shared study."""
    db, result = replayed
    again = tuner.tune(*PROBLEM, trials=36, replay=LANDSCAPE, db=db, seed=1, retime=0)
    assert again.study == result.study and again.previous == 30 and again.measured == 6
    trials = tuner.show(result.study, db=db).trials
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == len(trials) == 36


def test_sigterm_mid_study_ends_it_as_ctrl_c_and_the_same_command_finishes_it(tmp_path):
    """`kill PID` in the middle of a study through real Ray: the command says it was interrupted
    (exit 130, no native stack dump from Ray's own SIGTERM handler), its Ray goes with it, and the
    same command then completes the study without measuring a config twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tuner_doubles import ROOT

    db = f"sqlite:///{tmp_path / 'term.db'}"
    argv = [sys.executable, "-m", "tuner", "tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16",
            "--causal", "--replay", str(LANDSCAPE), "--trials", "100", "--db", db, "--seed", "0", "--retime", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TUNER_DB", None)
    child = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    for line in child.stderr:  # the study is under way once its first trial is measured
        if "new best" in line or time.monotonic() > deadline:
            break
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=90)
    assert child.returncode == 130, err[-2000:]
    assert "status    interrupted" in out and "logging.cc" not in err
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    (study,) = tuner.studies(db=db)
    trials = tuner.show(study.name, db=db).trials
    assert len(trials) == 100
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 100  # none measured twice
