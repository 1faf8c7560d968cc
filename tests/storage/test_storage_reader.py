"""storage.open_reader: a repository that reads and never writes, creates or migrates, on every
backend; and bests_version, which changes with every new or moved best (the server's cache)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from storage import RetimeEntry, StorageError, TrialOutcome, open_reader, open_repository


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT version_num FROM tuner_alembic_version")).scalar()
    finally:
        engine.dispose()


def test_the_reader_reads_and_refuses_every_write(url, repo, study_args):
    study = repo.open_study("s", **study_args())
    repo.record_trial(study.id, 0, {"block_m": 64}, TrialOutcome("ok", median_ms=2.0))
    reader = open_reader(url)
    try:
        assert [s.name for s in reader.studies()] == ["s"]
        assert reader.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True}).median_ms == 2.0
        assert reader.study_settings() == {"s": study_args()["settings"]}
        with pytest.raises(StorageError, match="(?i)read.?only"):
            reader.set_study_status(study.id, "finished")
        with pytest.raises(StorageError, match="(?i)read.?only"):
            reader.record_trial(study.id, 1, {"block_m": 128}, TrialOutcome("ok", median_ms=1.0))
    finally:
        reader.close()
    assert [t.number for t in repo.trials(study.id)] == [0] and repo.study("s").status == "running"


def test_bests_version_moves_with_each_new_or_moved_best_and_only_then(url, repo, study_args):
    study = repo.open_study("s", **study_args())
    reader = open_reader(url)
    try:
        empty = reader.bests_version()
        assert empty == () and reader.bests_version() == empty
        repo.record_trial(study.id, 0, {"block_m": 64}, TrialOutcome("ok", median_ms=2.0))
        first = reader.bests_version()
        assert first != empty and reader.bests_version() == first
        repo.record_trial(study.id, 1, {"block_m": 128}, TrialOutcome("ok", median_ms=3.0))  # slower: no new best
        repo.record_trial(study.id, 2, {"block_n": 32}, TrialOutcome("failed", failure="crash", reason="x"))
        assert reader.bests_version() == first
        repo.record_trial(study.id, 3, {"block_n": 64}, TrialOutcome("ok", median_ms=1.0))
        faster = reader.bests_version()
        assert faster != first
        repo.record_retiming(study.id, [RetimeEntry(3, median_ms=1.5), RetimeEntry(0, median_ms=1.2)])
        moved = reader.bests_version()
        assert moved not in (first, faster) and reader.bests_version() == moved
    finally:
        reader.close()


def test_the_reader_creates_and_migrates_nothing(url):
    with pytest.raises(StorageError, match="holds no tuner tables"):
        open_reader(url)
    assert _revision_or_none(url) is None  # still no table
    open_repository(url).close()
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE tuner_alembic_version SET version_num = '0004'"))
    engine.dispose()
    with pytest.raises(StorageError, match="older than this version's .*does not migrate it"):
        open_reader(url)
    assert _revision(url) == "0004"


def _revision_or_none(url: str) -> str | None:
    try:
        return _revision(url)
    except Exception:  # noqa: BLE001 - no such table
        return None
