"""Fixtures of the server's tests: a database tuned by replaying two recorded landscapes through
real Ray workers (no GPU), and the application over it, opened read-only."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterator

import pytest

from serve_data import LANDSCAPES, TUNED



@pytest.fixture(scope="session")
def served_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two problems tuned (12 trials each, re-timed) from recorded H200 landscapes."""
    import tuner
    from tuner import lookup

    url = f"sqlite:///{tmp_path_factory.mktemp('serve') / 'tuner.db'}"
    fam = lookup.family("attention")
    problems = [lookup.problem(fam, *spec) for spec in TUNED]
    done = tuner.tune_many("attention", problems, trials=12, replay=list(LANDSCAPES), db=url, seed=0)
    assert all(d.result is not None and d.result.best is not None for d in done)
    return url


@pytest.fixture
def db_copy(served_db: str, tmp_path: Path) -> str:
    """A copy of ``served_db`` that a test may write to (SQLite's backup API: WAL-safe)."""
    target = tmp_path / "copy.db"
    with sqlite3.connect(served_db.removeprefix("sqlite:///")) as source, sqlite3.connect(target) as copy:
        source.backup(copy)
    return f"sqlite:///{target}"


@pytest.fixture(scope="session")
def reader(served_db: str) -> Iterator[object]:
    from tuner.answers.reader import open_reader

    with open_reader(served_db) as opened:
        yield opened


@pytest.fixture(scope="session")
def app(reader: object) -> object:
    from tuner.answers.serve import create_app

    return create_app(reader)


@pytest.fixture(scope="session")
def client(app: object) -> object:
    from fastapi.testclient import TestClient

    return TestClient(app, raise_server_exceptions=False)
