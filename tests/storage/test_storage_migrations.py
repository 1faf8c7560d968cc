"""Schema: created by the migrations, idempotent, equal to the models, beside Optuna's tables."""

from __future__ import annotations

from datetime import datetime, timezone

import optuna
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from storage import StorageError, TrialOutcome, open_repository
from alembic import command

from storage.migrate import VERSION_TABLE, alembic_config, head_revision
from storage.models import Base

TABLES = {
    "tuner_devices",
    "tuner_families",
    "tuner_template_versions",
    "tuner_problems",
    "tuner_studies",
    "tuner_trials",
    "tuner_jobs",
    "tuner_job_problems",
    "tuner_tokens",
    "tuner_best",
    "tuner_retimes",
    "tuner_running_trials",
}


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _version(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return list(
                connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
            )
    finally:
        engine.dispose()


def test_open_creates_our_tables_and_nothing_else(url):
    open_repository(url).close()
    assert _tables(url) == TABLES | {VERSION_TABLE}
    assert _version(url) == [head_revision()]


def test_open_twice_is_a_no_op_and_keeps_data(url, study_args):
    with open_repository(url) as repo:
        study = repo.open_study("kept", **study_args())
        repo.record_trial(study.id, 0, {"a": 1}, TrialOutcome(status="ok", median_ms=1.0))
    with open_repository(url) as repo:
        assert [t.number for t in repo.trials(study.id)] == [0]
        assert repo.study("kept").n_ok == 1
    assert _version(url) == [head_revision()]


def test_a_database_at_0003_upgrades_keeping_every_trial(url, study_args):
    """0004 keys problems on their flags and 0005 adds the running trials; a database made at
    0003 keeps its trials, numbers and best, and numbers new trials after its highest."""
    with open_repository(url) as repo:
        study = repo.open_study("old", **study_args())
        for number, ms in ((0, 2.0), (4, 1.0), (7, 3.0)):  # numbers with gaps, as Optuna gave them
            repo.record_trial(study.id, number, {"a": number}, TrialOutcome(status="ok", median_ms=ms))
    engine = create_engine(url)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0003")
    engine.dispose()
    assert _version(url) == ["0003"] and "tuner_running_trials" not in _tables(url)
    with open_repository(url) as repo:  # opening upgrades
        assert _version(url) == [head_revision()]
        assert [(t.number, t.median_ms) for t in repo.trials(study.id)] == [(0, 2.0), (4, 1.0), (7, 3.0)]
        assert repo.best(*[study_args()[k] for k in ("family", "shape", "dtype", "flags")]).trial_number == 4
        assert repo.running(study.id) == []
        number = repo.claim_trial(study.id, {"a": 8}, owner="host:1")
        assert number == 8 and [r.number for r in repo.running(study.id)] == [8]
        repo.record_trial(study.id, number, {"a": 8}, TrialOutcome(status="failed", failure="crash"))
        assert repo.running(study.id) == [] and len(repo.trials(study.id)) == 4


def test_migrations_match_the_models(url):
    open_repository(url).close()
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    ours = [d for d in diff if "tuner_" in repr(d)]  # ignore unrelated tables of the database
    assert ours == []


def test_a_newer_schema_is_refused_and_left_alone(url, study_args):
    with open_repository(url) as repo:
        repo.open_study("future", **study_args())
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(StorageError, match="newer"):
        open_repository(url)
    assert _version(url) == ["9999"]
    assert "tuner_studies" in _tables(url)


def test_optuna_and_our_tables_share_a_database(url, study_args):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with open_repository(url) as repo:
        ours = repo.open_study("shared", **study_args())
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="shared", storage=storage)
    study.optimize(lambda trial: trial.suggest_int("x", 0, 3), n_trials=2)
    storage.engine.dispose()

    tables = _tables(url)
    assert TABLES | {VERSION_TABLE, "alembic_version", "studies", "trials"} <= tables
    with open_repository(url) as repo:  # our migration does not touch Optuna's tables
        repo.record_trial(ours.id, 0, {"x": 1}, TrialOutcome(status="ok", median_ms=2.0))
        assert repo.study("shared").n_trials == 1
    loaded = optuna.load_study(study_name="shared", storage=url)
    assert len(loaded.trials) == 2


def test_our_tables_can_come_after_optunas(url):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    optuna.create_study(study_name="first", storage=storage)
    storage.engine.dispose()
    with open_repository(url) as repo:
        assert repo.studies() == []
    assert optuna.load_study(study_name="first", storage=url).study_name == "first"


def test_a_database_of_revision_0003_keeps_every_problem_with_its_flags(url):
    """The causal column becomes the flags object: attention's rows keep their mask either way,
    another family's unmasked row gets no flags, and every trial stays with its problem."""
    from alembic import command

    from storage.migrate import alembic_config

    engine = create_engine(url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0003")
    with engine.begin() as connection:
        statements = [
            "INSERT INTO tuner_families (id, name) VALUES (1, 'attention'), (2, 'mine')",
            "INSERT INTO tuner_template_versions (id, family_id, template_hash, space, created_at) "
            "VALUES (1, 1, 'abc', '{}', '2026-11-01 00:00:00'), (2, 2, 'def', '{}', '2026-11-01 00:00:00')",
            "INSERT INTO tuner_problems (id, family_id, shape, dtype, causal) VALUES "
            "(1, 1, '[4,16,4096,128]', 'fp16', true), (2, 1, '[4,16,4096,128]', 'fp16', false), "
            "(3, 2, '[1024]', 'fp32', false)",
            "INSERT INTO tuner_devices (id, name, sm_count, compute_capability, driver_version, "
            "cuda_version) VALUES (1, 'NVIDIA H100 80GB HBM3', 132, '9.0', '570.86.15', '12.8')",
        ]
        for study, (version, problem) in enumerate(((1, 1), (1, 2), (2, 3)), start=1):
            statements += [
                f"INSERT INTO tuner_studies (id, name, template_version_id, problem_id, device_id, sampler, "
                f"status, replay, settings, created_at, updated_at) VALUES ({study}, 's{study}', {version}, "
                f"{problem}, 1, 'tpe', 'finished', false, '{{}}', '2026-11-01 00:00:00', '2026-11-01 00:00:00')",
                f"INSERT INTO tuner_trials (id, study_id, number, params, status, detail, median_ms, tflops, "
                f"replayed, created_at) VALUES ({study}, {study}, 0, '{{\"n\": 0}}', 'ok', '', {study}.0, 1.0, "
                f"false, '2026-11-01 00:00:00')",
                f"INSERT INTO tuner_best (id, template_version_id, problem_id, device_id, trial_id, median_ms, "
                f"tflops, updated_at) VALUES ({study}, {version}, {problem}, 1, {study}, {study}.0, 1.0, "
                f"'2026-11-01 00:00:00')",
            ]
        for statement in statements:
            connection.execute(text(statement))
    engine.dispose()

    with open_repository(url) as repo:
        masked = repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
        plain = repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": False})
        mine = repo.best("mine", [1024], "fp32", {})
        assert (masked.study, plain.study, mine.study) == ("s1", "s2", "s3")
        assert [len(repo.trials(i)) for i in (1, 2, 3)] == [1, 1, 1]
        assert repo.study("s1").flags == {"causal": True} and repo.study("s3").flags == {}
        assert repo.ensure_problem("attention", [4, 16, 4096, 128], "fp16", {"causal": True}) == 1
    assert _version(url) == [head_revision()]


def test_a_database_at_0005_gets_config_leases_and_keeps_one_running_row_per_config(url, study_args):
    """0006: measured and running trials carry their config's key; a config running twice (two
    coordinators of an older version) keeps its lowest-numbered row; its lease is then held."""
    from storage import ClaimRefused, config_key

    with open_repository(url) as repo:
        study = repo.open_study("old", **study_args())
        repo.record_trial(study.id, 0, {"a": 0}, TrialOutcome(status="ok", median_ms=2.0))
    engine = create_engine(url)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0005")
        for number, owner in ((1, "h:1"), (2, "h:2"), (3, "h:1")):
            connection.execute(text(
                "INSERT INTO tuner_running_trials (study_id, number, params, owner, started_at) "
                "VALUES (:s, :n, :p, :o, :t)"),
                {"s": study.id, "n": number, "p": '{"a": 1}' if number < 3 else '{"a": 3}', "o": owner,
                 "t": datetime.now(timezone.utc).replace(tzinfo=None)})
    engine.dispose()
    with open_repository(url) as repo:
        assert _version(url) == [head_revision()]
        assert [(r.number, r.params) for r in repo.running(study.id)] == [(1, {"a": 1}), (3, {"a": 3})]
        with pytest.raises(ClaimRefused, match="measured"):
            repo.claim_trial(study.id, {"a": 0}, owner="h:9")
        with pytest.raises(ClaimRefused, match="held"):
            repo.claim_trial(study.id, {"a": 1}, owner="h:9")
    engine = create_engine(url)
    with engine.connect() as connection:
        keys = connection.execute(text("SELECT config_key FROM tuner_trials")).scalars().all()
    engine.dispose()
    assert keys == [config_key({"a": 0})]


def test_a_database_at_0006_gets_each_trials_gpu_and_normalized_median(url, study_args):
    """0007: trials name the GPU that measured them and carry their normalized median; those of
    earlier versions keep them empty and are ranked by their median as before."""
    with open_repository(url) as repo:
        study = repo.open_study("old", **study_args())
        for number, ms in ((0, 2.0), (1, 1.0)):
            repo.record_trial(study.id, number, {"a": number}, TrialOutcome(
                status="ok", median_ms=ms, gpu_state={"sm_mhz": 1980, "temperature_c": 50}))
    engine = create_engine(url)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0006")
    engine.dispose()
    assert _version(url) == ["0006"]
    with open_repository(url) as repo:  # opening upgrades
        assert _version(url) == [head_revision()]
        old = repo.trials(study.id)
        assert [(t.number, t.median_ms, t.gpu_state["sm_mhz"]) for t in old] == [(0, 2.0, 1980), (1, 1.0, 1980)]
        assert all((t.gpu_uuid, t.gpu_index, t.normalized_ms, t.gpu_ratio) == (None,) * 4 for t in old)
        assert [t.ranked_ms for t in old] == [2.0, 1.0]
        # a trial of the slower GPU: raw 1.03, on the reference 0.99 -> the best
        repo.record_trial(study.id, 2, {"a": 2}, TrialOutcome(
            status="ok", median_ms=1.03, normalized_ms=0.99, gpu_ratio=0.99 / 1.03,
            gpu_uuid="GPU-b", gpu_index=1, tflops=103.0,
            gpu_state={"name": "H200", "before": {"sm_mhz": 1980}, "after": {"sm_mhz": 1965}}))
        new = repo.trials(study.id)[-1]
        assert (new.median_ms, new.normalized_ms, new.gpu_uuid, new.gpu_index) == (1.03, 0.99, "GPU-b", 1)
        best = repo.best(*[study_args()[k] for k in ("family", "shape", "dtype", "flags")])
        assert best.trial_number == 2 and best.median_ms == 0.99 and best.search_median_ms == 1.03
        assert best.tflops == pytest.approx(103.0 * 1.03 / 0.99)
        assert repo.study("old").best_median_ms == 0.99
