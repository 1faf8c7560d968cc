"""tune-many, best for a shape never tuned (and --validate), coverage and tune --json, through
real Ray, Optuna and SQLite on landscapes recorded on an H200 (three fp16 causal D=64 problems:
tests/data and the one the attention family ships).

The commands run in this process (:func:`cli`), as ``python -m tuner`` runs them in one of its own
(which tests/tuner/test_tuner_concurrency.py and test_tuner_replay.py do); after the first tests,
on one Ray for the rest of the module (``module_ray``)."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import statistics
import subprocess

import pytest

import tuner
from tuner.cli.commands import main
from tuner_doubles import LANDSCAPE, ROOT

DATA = ROOT / "tests" / "data"
SHAPES = """\
- {shape: "2,8,1024,64", dtype: fp16, flags: {causal: true}}
- shape: [4, 8, 512, 64]
  dtype: fp16
  flags: {causal: true}
"""
NEW = ["attention", "--shape", "1,16,2048,64", "--dtype", "fp16", "--causal"]  # never tuned


def cli(*argv: str, cwd) -> subprocess.CompletedProcess:
    """``tuner ARGV`` run in this process from the folder ``cwd``: its exit code, stdout and
    stderr (the progress lines too: the command's log handler writes to the stderr it finds)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """Two problems tuned by `tuner tune-many` (one command, one Ray, started and stopped by it)."""
    folder = tmp_path_factory.mktemp("many")
    (folder / "shapes.yaml").write_text(SHAPES)
    db = f"sqlite:///{folder / 'tuner.db'}"
    done = cli("tune-many", "attention", "--shapes", "shapes.yaml", "--trials", "10", "--retime", "2",
               "--seed", "3", "--replay", str(DATA), str(LANDSCAPE.parent), "--db", db, "--json",
               cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, db, done


def copy_of(db, path):
    """A copy of the module's database (SQLite's backup API: it is in write-ahead-log mode)."""
    with sqlite3.connect(db.removeprefix("sqlite:///")) as source, sqlite3.connect(path) as target:
        source.backup(target)
    return f"sqlite:///{path}"


def studies_of(db):
    return {tuple(s.shape): s for s in tuner.studies(db=db)}


def test_tune_many_tunes_each_problem_to_its_budget_warm_starting_the_later_ones(many):
    folder, db, done = many
    summary = json.loads(done.stdout)
    assert [entry["problem"] for entry in summary] == ["2x8x1024x64-fp16-causal", "4x8x512x64-fp16-causal"]
    assert all(e["result"]["status"] == "finished" and e["result"]["measured"] == 10 for e in summary)
    stored = studies_of(db)
    assert {k: s.n_trials for k, s in stored.items()} == {(2, 8, 1024, 64): 10, (4, 8, 512, 64): 10}
    assert all(s.replay and s.device_name == "NVIDIA H200" for s in stored.values())
    # the second study started from the first's winner (the existing warm start)
    first_winner = tuner.best("attention", "2,8,1024,64", "fp16", {"causal": True}, db=db)
    warm = stored[(4, 8, 512, 64)].settings["warm_start"]
    assert warm[0]["source"] == "2x8x1024x64-fp16-causal" and warm[0]["params"] == first_winner.params
    assert summary[1]["result"]["warm_start"][0]["source"] == "2x8x1024x64-fp16-causal"
    # progress: problem i/n and the best so far, on stderr
    lines = done.stderr.splitlines()
    assert any("problem 1/2 2x8x1024x64-fp16-causal: finished" in line and "best 0.0" in line for line in lines)
    assert any("problem 2/2 4x8x512x64-fp16-causal: finished" in line for line in lines)


def test_best_for_a_shape_never_tuned_answers_from_the_nearest_tuned_problem(many, tmp_path, capsys):
    folder, db, _ = many
    db = copy_of(db, tmp_path / "copy.db")
    before = studies_of(db)
    assert main(["best", *NEW, "--db", db, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    source = tuner.best("attention", "2,8,1024,64", "fp16", {"causal": True}, db=db)
    # nearest: 2x8x1024 is 1 apart in log2 S (B*H alike), 4x8x512 is 2 apart
    assert answer["measured"] is False and answer["source"] == "2x8x1024x64-fp16-causal"
    assert answer["params"] == source.params and answer["distance"] == 1.0
    assert main(["best", *NEW, "--db", db]) == 0
    text = capsys.readouterr().out
    assert "not measured for this shape" in text and "source    2x8x1024x64-fp16-causal, distance 1.00" in text
    assert studies_of(db).keys() == before.keys()  # answering stores nothing

    # --validate without a GPU: one line, exit 2, nothing stored
    assert main(["best", *NEW, "--db", db, "--validate"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["tuner: error: no GPU is visible (to tune without one, replay a "
                                        "recorded landscape with --replay FILE)"]
    assert studies_of(db).keys() == before.keys()


def test_best_validate_on_a_replay_measures_the_answer_and_stores_it(many, tmp_path, capsys, module_ray):
    """--validate on a replay measures the config answered from the nearest tuned problem and
    stores it: best is then measured."""
    folder, db, _ = many
    db = copy_of(db, tmp_path / "copy.db")
    assert main(["best", *NEW, "--db", db, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["measured"] is False
    done = cli("best", *NEW, "--db", db, "--validate", "--replay",
               str(DATA / "attention_1x16x2048x64-fp16-causal_h200.json"), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout)
    assert measured["measured"] is True and measured["params"] == answer["params"]
    study = studies_of(db)[(1, 16, 2048, 64)]
    trials = tuner.show(study.name, db=db).trials
    assert [t.params for t in trials] == [answer["params"]] and trials[0].median_ms == measured["median_ms"]


def test_tune_many_run_again_skips_what_is_at_its_budget_and_goes_on_with_the_rest(many, tmp_path, module_ray):
    folder, db, _ = many
    db = copy_of(db, tmp_path / "copy.db")
    before = {k: s.n_trials for k, s in studies_of(db).items()}
    (folder / "more.yaml").write_text(SHAPES + '- {shape: "1,16,2048,64", dtype: fp16, flags: {causal: true}}\n')
    done = cli("tune-many", "attention", "--shapes", "more.yaml", "--trials", "10", "--retime", "0",
               "--replay", str(DATA), str(LANDSCAPE), "--db", db, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("skipped: at its budget (10 trials; 10 measured)") == 2
    assert "1x16x2048x64-fp16-causal  finished: 10 trials measured; 10 measured now" in done.stdout
    after = {k: s.n_trials for k, s in studies_of(db).items()}
    assert after == {**before, (1, 16, 2048, 64): 10}
    # a bigger budget continues each study where it stopped
    bigger = cli("tune-many", "attention", "--shapes", "shapes.yaml", "--trials", "12", "--retime", "0",
                 "--replay", str(DATA), str(LANDSCAPE), "--db", db, "--json", cwd=folder)
    assert bigger.returncode == 0, bigger.stderr[-3000:]
    assert [(e["result"]["measured"], e["result"]["previous"]) for e in json.loads(bigger.stdout)] == [(2, 10), (2, 10)]
    assert {k: s.n_trials for k, s in studies_of(db).items()}[(2, 8, 1024, 64)] == 12


def test_coverage_tables_the_tuned_problems_and_scores_the_rule_leave_one_out(many, capsys):
    folder, db, _ = many
    assert main(["coverage", "attention", "--db", db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["problem"]: r for r in report["rows"]}
    stored = {s.name: s for s in tuner.studies(db=db)}
    assert set(rows) >= {"2x8x1024x64-fp16-causal", "4x8x512x64-fp16-causal"}
    for row in rows.values():
        assert row["device"] == "NVIDIA H200" and row["current"] and row["age_s"] >= 0
        assert row["trials"] == stored[row["study"]].n_trials and row["peers"] == {}
    # leave-one-out, worked out here from the stored trials: each problem's pick is the winner of
    # the nearest other (all three share dtype, flags and D), timed in its own study
    held = {h["problem"]: h for h in report["rule"]["held"]}
    ratios = []
    for key, entry in held.items():
        assert entry["source"] in rows and entry["source"] != key
        own = tuner.best("attention", rows[key]["shape"], "fp16", {"causal": True}, db=db)
        pick = tuner.best("attention", rows[entry["source"]]["shape"], "fp16", {"causal": True}, db=db).params
        there = {json.dumps(t.params, sort_keys=True): t for t in tuner.show(rows[key]["study"], db=db).trials}
        trial = there.get(json.dumps(pick, sort_keys=True))
        if pick == own.params:
            assert entry["ratio"] == 1.0
        elif trial is None:
            assert entry["outcome"] == "unknown" and entry["ratio"] is None
        else:
            assert entry["ratio"] == pytest.approx(trial.median_ms / own.search_median_ms)
        if entry["ratio"] is not None:
            ratios.append(entry["ratio"])
    rule = report["rule"]
    assert rule["known"] == len(ratios) and rule["unknown"] == len(held) - len(ratios) - rule["failed"]
    if ratios:
        assert rule["median"] == pytest.approx(statistics.median(ratios)) and rule["worst"] == max(ratios)
    assert main(["coverage", "attention", "--db", db]) == 0
    text = capsys.readouterr().out
    assert "| problem | GPU | template | trials | best | TFLOPS | vs peers | age |" in text
    assert f"leave-one-out over {len(held)} tuned problem(s)" in text


def test_tune_json_prints_the_runs_summary(tmp_path, module_ray):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    # the landscape the attention family ships, by its name (as a wheel install runs the README)
    done = cli("tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal", "--trials", "6",
               "--retime", "2", "--replay", LANDSCAPE.name, "--db", db, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "finished" and result["measured"] == 6 and result["study"].endswith("/replay")
    assert result["best"]["params"] == tuner.best("attention", "2,8,1024,64", "fp16", {"causal": True}, db=db).params
    assert len(result["retimed"]) == 2 and result["device"] == "NVIDIA H200"
    stored = tuner.studies(db=db)[0]
    assert stored.settings["replay_file"] == str(LANDSCAPE)


def test_a_folder_of_landscapes_gives_its_compressed_ones_too():
    from templates import get_family
    from tuner.study.many import recorded_landscapes

    family = get_family("attention")
    found = recorded_landscapes(family, [LANDSCAPE.parent])  # the family's own: a .json and a .json.gz
    assert {p.key: path.name for p, path in found.items()} == {
        "2x8x1024x64-fp16-causal": "attention_2x8x1024x64-fp16-causal_h200.json",
        "2x8x1024x256-fp16-causal": "attention_2x8x1024x256-fp16-causal_h200.json.gz"}
