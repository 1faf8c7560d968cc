"""Suite-wide fixtures.

- Tests marked ``gpu`` run only where the CUDA driver sees a GPU.
- ``url``: an empty database of each backend, a SQLite file and the local PostgreSQL. PostgreSQL:
  one fresh database ``tuner_test_<random>`` per test session (created through the server's
  ``test`` database, dropped at the end) and one fresh schema per test, so tests never see each
  other's rows or anybody else's. The server is ``$TUNER_TEST_PG`` if set, else
  ``postgresql://postgres@127.0.0.1:5432/test`` (then user ``root``). When no server answers the
  PostgreSQL cases are skipped, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url


def _has_gpu() -> bool:
    from workers.driver import gpu_count

    return gpu_count() > 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The pool of tests/cores.py stops with the session."""
    import cores

    cores.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items) or _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible to the CUDA driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


ADMIN_URLS = ["postgresql://postgres@127.0.0.1:5432/test", "postgresql://root@127.0.0.1:5432/test"]


def _admin_url() -> URL | str:
    """A URL that reaches the server, or the reason none does."""
    candidates = [os.environ["TUNER_TEST_PG"]] if os.environ.get("TUNER_TEST_PG") else ADMIN_URLS
    reasons = []
    for candidate in candidates:
        engine = create_engine(candidate, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return make_url(candidate)
        except Exception as error:  # noqa: BLE001 - any failure means "no server here"
            reasons.append(f"{candidate}: {str(error).splitlines()[0]}")
        finally:
            engine.dispose()
    return "; ".join(reasons)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[URL]:
    """A fresh database for this test session, dropped at the end."""
    admin = _admin_url()
    if isinstance(admin, str):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"no PostgreSQL server for the storage tests: {admin}")
        pytest.skip(f"no PostgreSQL server: {admin}")
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.set(database=name)
    finally:
        with engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path) -> str:
    """An empty database of each backend, as a URL string."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuner.db'}"
    database: URL = request.getfixturevalue("postgres_database")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(database)
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    # Every connection made from this URL (ours and Optuna's) works in that schema only.
    scoped = database.update_query_dict({"options": f"-csearch_path={schema}"})
    return scoped.render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def module_ray() -> Iterator[None]:
    """A local Ray up from the first test of a module that asks for it to the module's end, as
    ``workers.ray_session.shared_ray`` keeps one across studies: the studies there (replays,
    in this process) find it up, and neither start nor stop one (about 6 s each on the 2-core
    CI machine). The module's later tests find it up too."""
    from workers.ray_session import shared_ray

    with shared_ray():
        yield
