"""Fixtures of the tuner tests: the toy family registered, a SQLite URL, fake pools for tune()."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

import tuner.api
from tuner_doubles import PROBLEM, FakePool, PoolFactory, ToyFamily, no_ray, registered


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[ToyFamily]:
    with registered(ToyFamily, tmp_path / "toy_family") as family:
        yield family


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture
def empty_db(db: str) -> str:
    """``db`` created, with our tables and nothing in them (the read calls refuse a missing file)."""
    from storage import open_repository

    open_repository(db).close()
    return db


@pytest.fixture
def pools(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> PoolFactory:
    """Make :func:`tuner.tune` measure on FakePools. Their studies run without the
    optuna-dashboard copy (``TUNER_OPTUNA_COPY=0``): the copy's process, its start and its
    Optuna tables, cost each of these studies about 1.2 s of the 1.4 s it took on the 2-core CI
    machine. A test whose studies have their copy (it reads the copy, or the copy is what it
    tests) is marked ``optuna_copy``: test_tuner_dashboard.py, and the studies in
    test_tuner_concurrency.py and test_tuner_replay.py (real processes, real Ray) have theirs."""
    factory = PoolFactory()
    monkeypatch.setattr(tuner.api, "_open_pool", factory)
    monkeypatch.setattr(tuner.api, "_ray", no_ray)
    if request.node.get_closest_marker("optuna_copy") is None:
        monkeypatch.setenv("TUNER_OPTUNA_COPY", "0")
    return factory




@pytest.fixture(scope="session")
def _grid_tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuner.TuneResult, FakePool]:
    """The toy space tuned once with the grid sampler (slow: ~70 trials through SQLite)."""
    path = tmp_path_factory.mktemp("grid") / "tuner.db"
    with registered(ToyFamily, tmp_path_factory.mktemp("toy_family")):
        with pytest.MonkeyPatch.context() as patch:
            pools = PoolFactory()
            patch.setattr(tuner.api, "_open_pool", pools)
            patch.setattr(tuner.api, "_ray", no_ray)
            result = tuner.tune("toy", *PROBLEM, sampler="grid", db=f"sqlite:///{path}", seed=0)
    return path, result, pools.used[0]


@pytest.fixture
def tuned(toy: ToyFamily, db: str, _grid_tuned: tuple[Path, tuner.TuneResult, FakePool]) -> Tuned:
    """A copy of the grid-tuned database at ``db`` (same template hash as ``toy``), the
    TuneResult and the pool it measured on."""
    path, result, pool = _grid_tuned
    # SQLite's backup API: the database is in write-ahead-log mode, and a plain file copy would
    # miss what is still in the -wal file.
    with sqlite3.connect(path) as source, sqlite3.connect(db.removeprefix("sqlite:///")) as target:
        source.backup(target)
    return Tuned(result, pool)


class Tuned(NamedTuple):
    result: tuner.TuneResult
    pool: FakePool
