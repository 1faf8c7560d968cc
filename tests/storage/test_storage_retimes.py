"""Re-timings: stored with their ranks and GPU state, and the best row follows their winner."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from storage import RetimeEntry, StorageError, TrialOutcome, open_repository
from storage.migrate import VERSION_TABLE, alembic_config, head_revision

PROBLEM = ("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
STATE = {"before": {"sm_mhz": 1980, "mem_mhz": 2619, "temperature_c": 41},
         "after": {"sm_mhz": 1755, "mem_mhz": 2619, "temperature_c": 58}, "rounds": 30}


def _ok(repo, study, number, median_ms, **extra):
    values = {"status": "ok", "median_ms": median_ms, "tflops": 100.0 / median_ms, **extra}
    return repo.record_trial(study.id, number, {"n": number}, TrialOutcome(**values))


def _entry(number, median_ms, **extra):
    spread = dict(iqr_ms=median_ms / 100, min_ms=median_ms * 0.99, max_ms=median_ms * 1.05,
                  repetitions=30, tflops=100.0 / median_ms)
    return RetimeEntry(number, median_ms=median_ms, **{**spread, **extra})


def test_the_winner_is_chosen_by_the_retimed_medians(repo, study_args):
    study = repo.open_study("s", **study_args())
    for number, ms in enumerate([1.00, 1.10, 1.20]):
        _ok(repo, study, number, ms)
    assert repo.best(*PROBLEM).trial_number == 0
    # The re-timing reverses the search's order of the first two.
    stored = repo.record_retiming(study.id, [_entry(0, 1.15), _entry(1, 1.05), _entry(2, 1.25)],
                                  gpu_state=STATE)
    assert [(r.trial_number, r.rank) for r in stored] == [(1, 1), (0, 2), (2, 3)]
    first = stored[0]
    assert (first.median_ms, first.iqr_ms, first.min_ms, first.max_ms, first.repetitions) == (
        1.05, 0.0105, 1.05 * 0.99, 1.05 * 1.05, 30)
    assert first.search_median_ms == 1.10 and first.retiming == 1 and first.ok
    assert first.gpu_state == STATE and not first.replayed and first.tflops == 100.0 / 1.05
    assert repo.retimes(study.id) == stored

    best = repo.best(*PROBLEM)
    assert (best.trial_number, best.median_ms, best.search_median_ms) == (1, 1.05, 1.10)
    assert (best.iqr_ms, best.repetitions, best.tflops) == (0.0105, 30, 100.0 / 1.05)
    assert best.retime == first
    assert [b.trial_number for b in repo.bests("attention")] == [1]
    # the trials themselves are kept as the search measured them
    assert [t.median_ms for t in repo.trials(study.id)] == [1.00, 1.10, 1.20]


def test_failed_retimes_are_stored_unranked_and_never_win(repo, study_args):
    study = repo.open_study("s", **study_args())
    _ok(repo, study, 0, 1.0)
    _ok(repo, study, 1, 1.1)
    stored = repo.record_retiming(study.id, [
        RetimeEntry(0, failure="wrong", reason="relative error 0.5"), _entry(1, 1.2)])
    assert [(r.trial_number, r.rank, r.failure) for r in stored] == [(1, 1, None), (0, None, "wrong")]
    assert stored[1].median_ms is None and stored[1].reason == "relative error 0.5" and not stored[1].ok
    best = repo.best(*PROBLEM)
    assert (best.trial_number, best.median_ms) == (1, 1.2)  # slower, but the only one that passed

    again = repo.record_retiming(study.id, [RetimeEntry(1, failure="crash", reason="x")])
    assert again[0].retiming == 2
    assert repo.best(*PROBLEM).retime == stored[0]  # nothing passed: the best stays
    assert [r.retiming for r in repo.retimes(study.id, every=True)] == [1, 1, 2]
    assert repo.retimes(study.id) == again


def test_a_faster_best_of_another_study_is_kept(repo, study_args):
    one = repo.open_study("one", **study_args())
    two = repo.open_study("two", **study_args(sampler="random"))  # same problem, other study
    _ok(repo, one, 0, 1.0)
    _ok(repo, two, 0, 1.1)
    repo.record_retiming(two.id, [_entry(0, 1.05)])
    assert (repo.best(*PROBLEM).study, repo.best(*PROBLEM).median_ms) == ("one", 1.0)
    repo.record_retiming(two.id, [_entry(0, 0.95)])
    best = repo.best(*PROBLEM)
    assert (best.study, best.median_ms, best.retime.retiming) == ("two", 0.95, 2)


def test_a_faster_trial_later_takes_the_best_from_a_retiming(repo, study_args):
    study = repo.open_study("s", **study_args())
    _ok(repo, study, 0, 1.0)
    repo.record_retiming(study.id, [_entry(0, 1.02)])
    _ok(repo, study, 1, 1.01)
    best = repo.best(*PROBLEM)
    assert (best.trial_number, best.median_ms, best.retime) == (1, 1.01, None)
    assert best.search_median_ms == 1.01


@pytest.mark.parametrize("entries, message", [
    ([RetimeEntry(7, median_ms=1.0)], "has no trial 7"),
    ([RetimeEntry(2, median_ms=1.0)], "trial 2 failed; only ok trials are re-timed"),
    ([RetimeEntry(0, median_ms=1.0), RetimeEntry(0, median_ms=1.1)], "names a trial twice"),
    ([RetimeEntry(0, median_ms=float("nan"))], "finite median_ms"),
    ([RetimeEntry(0)], "finite median_ms"),
])
def test_bad_retimings_are_refused_and_store_nothing(repo, study_args, entries, message):
    study = repo.open_study("s", **study_args())
    _ok(repo, study, 0, 1.0)
    _ok(repo, study, 1, 1.1)
    repo.record_trial(study.id, 2, {"n": 2}, TrialOutcome(status="failed", failure="wrong", reason="bad"))
    with pytest.raises(StorageError, match=message) as caught:
        repo.record_retiming(study.id, [_entry(1, 0.5), *entries])
    assert "\n" not in str(caught.value)
    assert repo.retimes(study.id, every=True) == []
    best = repo.best(*PROBLEM)
    assert (best.trial_number, best.median_ms, best.retime) == (0, 1.0, None)


def test_a_database_of_revision_0002_is_upgraded_and_keeps_its_best(url):
    """A database made before re-timings existed: its rows are kept and can be re-timed."""
    engine = create_engine(url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0002")
    with engine.begin() as connection:
        for statement in (
            "INSERT INTO tuner_families (id, name) VALUES (1, 'attention')",
            "INSERT INTO tuner_template_versions (id, family_id, template_hash, space, created_at) "
            "VALUES (1, 1, 'abc', '{}', '2026-11-01 00:00:00')",
            "INSERT INTO tuner_problems (id, family_id, shape, dtype, causal) "
            "VALUES (1, 1, '[4,16,4096,128]', 'fp16', true)",
            "INSERT INTO tuner_devices (id, name, sm_count, compute_capability, driver_version, "
            "cuda_version) VALUES (1, 'NVIDIA H100 80GB HBM3', 132, '9.0', '570.86.15', '12.8')",
            "INSERT INTO tuner_studies (id, name, template_version_id, problem_id, device_id, "
            "sampler, status, replay, settings, created_at, updated_at) VALUES (1, 'old', 1, 1, 1, "
            "'tpe', 'finished', false, '{}', '2026-11-01 00:00:00', '2026-11-01 00:00:00')",
            "INSERT INTO tuner_trials (id, study_id, number, params, status, detail, median_ms, "
            "tflops, replayed, toolkit, created_at) VALUES (1, 1, 0, '{\"n\": 0}', 'ok', '', 1.0, "
            "100.0, false, 'nvcc 13.0.88', '2026-11-01 00:00:00')",
            "INSERT INTO tuner_trials (id, study_id, number, params, status, detail, median_ms, "
            "tflops, replayed, created_at) VALUES (2, 1, 1, '{\"n\": 1}', 'ok', '', 1.1, 90.0, "
            "false, '2026-11-01 00:00:00')",
            "INSERT INTO tuner_best (id, template_version_id, problem_id, device_id, trial_id, "
            "median_ms, tflops, updated_at) VALUES (1, 1, 1, 1, 1, 1.0, 100.0, '2026-11-01 00:00:00')",
        ):
            connection.execute(text(statement))
        assert connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "0002"
    engine.dispose()

    with open_repository(url) as repo:
        best = repo.best(*PROBLEM)
        assert (best.trial_number, best.median_ms, best.search_median_ms, best.retime) == (0, 1.0, 1.0, None)
        assert best.toolkit == "nvcc 13.0.88" and len(repo.trials(1)) == 2
        assert repo.retimes(1) == []
        repo.record_retiming(1, [_entry(0, 1.2), _entry(1, 1.05)])
        best = repo.best(*PROBLEM)
        assert (best.trial_number, best.median_ms, best.retime.rank) == (1, 1.05, 1)
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == head_revision()
    engine.dispose()
