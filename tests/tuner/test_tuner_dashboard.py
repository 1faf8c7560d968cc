"""optuna-dashboard on our database, unmodified: the Optuna copy a study keeps of its trials
(``tuner.study.dashboard``), read through optuna-dashboard's own WSGI app, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
import math
import sqlite3
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from optuna.trial import TrialState

import tuner
from tuner_doubles import PROBLEM, failure_of

optuna_dashboard = pytest.importorskip("optuna_dashboard")  # in the [test] extra: never skipped there
pytestmark = pytest.mark.optuna_copy  # the studies here keep their copy: it is what is tested


def _get(app, path):
    """GET ``path`` from a WSGI app: (status, parsed JSON)."""
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"] = status

    body = b"".join(app(environ, start_response))
    return seen["status"], json.loads(body)


def _our_rows(path):
    """Every row of our tables (``tuner_*``) in a SQLite file, and their schema."""
    with sqlite3.connect(path) as connection:
        names = [n for (n,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tuner_%' ORDER BY name")]
        return {n: sorted(map(repr, connection.execute(f'SELECT * FROM "{n}"'))) for n in names}


def test_optuna_dashboard_serves_the_studies_with_failures_as_fail(toy, pools, url):
    result = tuner.tune("toy", *PROBLEM, sampler="grid", db=url, seed=0, retime=0)
    stored = {t.number: t for t in tuner.show(result.study, db=url).trials}
    failed = [t for t in stored.values() if t.status == "failed"]
    assert failed and len(failed) < len(stored)  # the toy space fails on WARPS=4, STAGES=2
    our_rows = _our_rows(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else None

    app = optuna_dashboard.wsgi(url)  # what `optuna-dashboard URL` serves
    status, listed = _get(app, "/api/studies")
    assert status.startswith("200")
    [study] = [s for s in listed["study_summaries"] if s["study_name"] == result.study]
    attrs = {a["key"]: a["value"] for a in study["user_attrs"]}
    assert attrs["family"] == "toy" and attrs["problem"] == "2x4x1024x64-fp16"
    assert attrs["gpu"] == "NVIDIA H100 80GB HBM3" and attrs["template_version"] == toy.template_hash

    status, detail = _get(app, f"/api/studies/{study['study_id']}")
    assert status.startswith("200")
    assert detail["objective_names"] == ["median_ms"]
    trials = detail["trials"]
    assert len(trials) == len(stored)
    numbers = []
    for trial in trials:
        user = {a["key"]: a["value"] for a in trial["user_attrs"]}
        mine = stored[int(user["number"])]
        numbers.append(mine.number)
        if mine.status == "ok":
            assert trial["state"] == "Complete" and trial["values"] == [mine.median_ms]
        else:  # FAIL, never a value of inf; its kind and reason beside it
            assert trial["state"] == "Fail" and not trial.get("values")
            assert user["failure"] == mine.failure == failure_of(mine.params)
            assert user["reason"] == mine.reason
    assert sorted(numbers) == sorted(stored)  # each stored trial once
    best = min(t.median_ms for t in stored.values() if t.status == "ok")
    assert detail["best_trials"][0]["values"] == [best]
    if our_rows is not None:  # the dashboard wrote nothing of ours
        assert _our_rows(url.removeprefix("sqlite:///")) == our_rows


def test_the_copy_takes_in_what_a_run_without_it_stored(toy, pools, db, monkeypatch):
    monkeypatch.setenv("TUNER_OPTUNA_COPY", "0")
    first = tuner.tune("toy", *PROBLEM, trials=12, db=db, seed=0, retime=0)
    assert first.study not in optuna.get_all_study_names(db)  # off: nothing written
    monkeypatch.delenv("TUNER_OPTUNA_COPY")
    tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=0, retime=0)
    tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=0, retime=0)  # at its count: nothing new
    copied = optuna.load_study(study_name=first.study, storage=db).get_trials(deepcopy=False)
    stored = tuner.show(first.study, db=db).trials
    assert len(stored) == 20
    assert sorted(t.user_attrs["number"] for t in copied) == [t.number for t in stored]


def test_an_earlier_versions_sampler_study_is_replaced_by_the_copy(toy, pools, db):
    """Before our tables were the record, the sampler's study lived in Optuna's tables under the
    same name, its failures COMPLETE with the value inf: what optuna-dashboard showed."""
    name = f"toy/2x4x1024x64-fp16/H100-80GB-HBM3/{toy.template_hash}"
    old = optuna.create_study(study_name=name, storage=db, direction="minimize")
    old.add_trial(optuna.trial.create_trial(
        params={"WARPS": 4}, distributions={"WARPS": optuna.distributions.CategoricalDistribution([1, 2, 4])},
        value=math.inf))
    result = tuner.tune("toy", *PROBLEM, trials=10, db=db, seed=0, retime=0)
    assert result.study == name
    copy = optuna.load_study(study_name=name, storage=db)
    assert len(copy.trials) == 10 and all("number" in t.user_attrs for t in copy.trials)
    assert all(t.value is None or math.isfinite(t.value) for t in copy.trials)
    assert copy.metric_names == ["median_ms"]
    assert {t.state for t in copy.trials} <= {TrialState.COMPLETE, TrialState.FAIL}


def test_while_the_study_runs_the_copy_waits_after_each_write_as_long_as_it_took(db, monkeypatch):
    """The copy leaves the database free half the time while the coordinator writes to it too
    (on SQLite a copy writing trial after trial kept the coordinator's writes waiting up to 0.6 s);
    once the coordinator closes the pipe that says it runs, the rest is written without waits."""
    import os
    import pickle

    from storage import TrialOutcome, open_repository
    from tuner.study import dashboard

    repo = open_repository(db)
    device = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_capability": "9.0",
              "driver_version": "580.65", "cuda_version": "13.0"}
    waits = []
    monkeypatch.setattr(dashboard.time, "sleep", waits.append)
    for name, study_runs in (("running", True), ("closed", False)):
        record = repo.open_study(name, family="toy", template_hash="0123456789abcdef",
                                 space={"A": [1, 2, 3]}, shape=[1, 2], dtype="fp16", flags={},
                                 device=device, sampler="random", replay=False, settings={})
        for a in (1, 2, 3):
            number = repo.claim_trial(record.id, {"A": a}, owner="me:1")
            repo.record_trial(record.id, number, {"A": a}, TrialOutcome("ok", median_ms=0.5 * a), owner="me:1")
        trials = repo.trials(record.id)
        stream = io.BytesIO()
        pickle.dump((db, record, trials[:1]), stream)  # one trial missing from the copy at its start
        for trial in trials[1:]:  # then two batches as a study stores them
            pickle.dump([trial], stream)
        pickle.dump(None, stream)
        stream.seek(0)
        read_end, write_end = os.pipe()
        if not study_runs:
            os.close(write_end)  # the coordinator closed the copy (or is gone)
        waits.clear()
        try:
            assert dashboard.serve(stream, read_end) == 3
        finally:
            os.close(read_end)
            if study_runs:
                os.close(write_end)
        if study_runs:
            assert len(waits) == 3 and all(w > 0 for w in waits)  # each write followed by its own length
        else:
            assert waits == []
        assert len(optuna.load_study(study_name=name, storage=db).trials) == 3
    repo.close()


# -- tuner report ------------------------------------------------------------------------------------
def test_report_writes_one_png_of_the_study(toy, db, tuned, tmp_path, capsys):
    from tuner.cli.commands import main

    out = tmp_path / "report.png"
    assert main(["report", tuned.result.study, "-o", str(out), "--db", db]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    by_id = tmp_path / "by_id.png"  # the study's id, as `show` takes it
    study_id = tuner.studies(db=db)[0].id
    assert main(["report", str(study_id), "-o", str(by_id), "--db", db]) == 0 and by_id.is_file()


def test_report_panels_say_what_they_show(toy, db, tuned):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuner.reports.study_plot import figure

    detail = tuner.show(tuned.result.study, db=db)
    fig = figure(plt, detail.summary, detail.trials)
    best_trials, best_time, importances, failures = fig.axes
    kinds = {t.failure for t in detail.trials if t.status == "failed"}
    assert {label.get_text() for label in failures.get_xticklabels()} == kinds
    assert sum(bar.get_height() for bar in failures.patches) == detail.summary.n_failed
    assert {label.get_text() for label in importances.get_yticklabels()} <= set(detail.trials[0].params)
    assert importances.patches  # computed: the grid measured every config
    best = min(t.median_ms for t in detail.trials if t.status == "ok")
    assert f"{best:.4f} ms" in best_trials.get_legend().get_texts()[1].get_text()
    assert toy.template_hash in fig._suptitle.get_text() and "2x4x1024x64-fp16" in fig._suptitle.get_text()
    few = figure(plt, detail.summary, detail.trials[:4])  # too few ok trials: said, not failed
    assert any("too few ok trials" in text.get_text() for text in few.axes[2].texts)
    plt.close(fig)
    plt.close(few)


def test_report_refuses_a_bad_study_or_output_in_one_line(toy, db, tuned, tmp_path, capsys):
    from tuner.cli.commands import main

    assert main(["report", "no/such/study", "-o", str(tmp_path / "r.png"), "--db", db]) == 2
    assert main(["report", tuned.result.study, "-o", str(tmp_path / "missing" / "r.png"), "--db", db]) == 2
    assert main(["report", tuned.result.study, "-o", str(tmp_path), "--db", db]) == 2  # a folder
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("tuner: error: ") for line in lines)
    assert "no study named" in lines[0] and "cannot write" in lines[1] and "cannot write" in lines[2]
    assert not (tmp_path / "r.png").exists()


def test_a_run_leaves_the_catch_up_to_a_live_coordinator_beside_it(db):
    """At its start a run adds the stored trials the copy lacks, except while another coordinator
    measures the study (it adds its own: both adding them would copy them twice)."""
    import os
    import socket

    from storage import TrialOutcome, open_repository
    from tuner.study import dashboard

    repo = open_repository(db)
    device = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_capability": "9.0",
              "driver_version": "580.65", "cuda_version": "13.0"}
    record = repo.open_study("copied", family="toy", template_hash="0123456789abcdef",
                             space={"A": [1, 2, 3], "B": [[1, 2], [2, 1]]}, shape=[1, 2], dtype="fp16",
                             flags={}, device=device, sampler="random", replay=False, settings={})
    for a in (1, 2):
        number = repo.claim_trial(record.id, {"A": a, "B": [1, 2]}, owner="gone:1")
        outcome = TrialOutcome("ok", median_ms=0.5 * a) if a == 1 else TrialOutcome(
            "failed", failure="compile", reason="ptxas: too many resources")
        repo.record_trial(record.id, number, {"A": a, "B": [1, 2]}, outcome, owner="gone:1")
    live = repo.claim_trial(record.id, {"A": 3, "B": [2, 1]}, owner=f"{socket.gethostname()}:{os.getppid()}")
    beside = dashboard.start(db, record, repo)
    beside.close()
    assert beside.written == 0
    repo.drop_trial(record.id, live)  # alone now
    alone = dashboard.start(db, record, repo)
    alone.close()
    assert alone.written == 2
    copy = optuna.load_study(study_name="copied", storage=db)
    assert [(t.state, t.value, t.params) for t in copy.trials] == [
        (TrialState.COMPLETE, 0.5, {"A": 1, "B": "[1, 2]"}), (TrialState.FAIL, None, {"A": 2, "B": "[1, 2]"})]
    assert copy.trials[1].user_attrs["failure"] == "compile"
    assert copy.user_attrs["problem"] == "1x2-fp16" and copy.user_attrs["template_version"] == "0123456789abcdef"
    repo.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_batch_is_written_in_one_transaction_as_optuna_would_write_each_trial(db, monkeypatch, batched):
    """Optuna's public API reads back from a batch what ``add_trial`` writes trial by trial (the
    fallback where Optuna's models differ): the same states, values (inf too), params,
    distributions, attributes and numbers, in one transaction."""
    from storage import TrialOutcome, open_repository
    from tuner.study import dashboard
    from tuner.study.optuna_export import optuna_trial, space_distributions

    repo = open_repository(db)
    device = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_capability": "9.0",
              "driver_version": "580.65", "cuda_version": "13.0"}
    record = repo.open_study("batched", family="toy", template_hash="0123456789abcdef",
                             space={"A": [1, 2, 3], "B": ["x", "y"]}, shape=[1, 2], dtype="fp16", flags={},
                             device=device, sampler="random", replay=False, settings={})
    for a, b in ((1, "x"), (2, "y"), (3, "x")):
        number = repo.claim_trial(record.id, {"A": a, "B": b}, owner="me:1")
        outcome = TrialOutcome("ok", median_ms=0.5 * a) if a != 2 else TrialOutcome("failed", failure="compile", reason="no")
        repo.record_trial(record.id, number, {"A": a, "B": b}, outcome, owner="me:1")
    trials = repo.trials(record.id)
    if not batched:
        monkeypatch.setattr(dashboard, "_write_batch", lambda *a: (_ for _ in ()).throw(dashboard._NoBatch("old")))
    storage, study, numbers = dashboard._open(db, record)
    distributions = space_distributions(record.space)
    assert numbers == set()
    transactions = []
    if batched:
        real = dashboard._write_batch
        monkeypatch.setattr(dashboard, "_write_batch", lambda *a: transactions.append(1) or real(*a))
    assert dashboard._write(storage, study, trials[:1], distributions) == 1
    assert dashboard._write(storage, study, trials[1:], distributions) == 2
    assert len(transactions) == (2 if batched else 0)
    got = optuna.load_study(study_name="batched", storage=db).get_trials()
    want = [optuna_trial(t, distributions) for t in trials]
    assert [t.number for t in got] == [0, 1, 2]
    for g, w in zip(got, want):
        assert (g.state, g.value, g.params, g.distributions, g.user_attrs) == \
            (w.state, w.value, w.params, w.distributions, w.user_attrs)
        assert g.datetime_start == w.datetime_start and g.datetime_complete == w.datetime_complete
    storage.engine.dispose()
