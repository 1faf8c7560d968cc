"""Opening a database: default URL, and one clear StorageError line for every bad one."""

from __future__ import annotations

import socket
import time

import pytest

from storage import StorageError, default_url, engine, open_repository


def test_default_url_is_tuner_db_env_or_a_file_in_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("TUNER_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_url() == f"sqlite:///{tmp_path / 'tuner.db'}"
    monkeypatch.setenv("TUNER_DB", "postgresql://u@h/db")
    assert default_url() == "postgresql://u@h/db"


def test_open_none_uses_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv("TUNER_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    open_repository().close()
    assert (tmp_path / "tuner.db").exists()


def test_a_sqlite_file_is_put_in_write_ahead_log_mode_for_every_connection(tmp_path):
    import sqlite3

    open_repository(f"sqlite:///{tmp_path / 'wal.db'}").close()
    other = sqlite3.connect(tmp_path / "wal.db")  # another program's connection (Optuna's)
    assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    other.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "not a database URL"),
        ("nosuchdb://host/x", "cannot open database nosuchdb://host/x"),
        ("sqlite:////no/such/folder/tuner.db", "unable to open database file"),
    ],
)
def test_bad_urls_raise_one_line(url, message):
    with pytest.raises(StorageError, match=message) as caught:
        open_repository(url)
    assert "\n" not in str(caught.value)


def test_a_connection_waits_for_another_ones_lock_as_long_as_a_writer_would(tmp_path, monkeypatch):
    """The switch to WAL of a new connection is retried while another connection holds the file
    locked, for as long as the busy timeout (not the 5 s a silent server gets: a run started right
    after a killed one failed so under load): here the lock is held past the connect timeout."""
    import sqlite3
    import threading

    monkeypatch.setattr(engine, "CONNECT_TIMEOUT_S", 0.3)
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # a rollback-journal file, locked: WAL cannot be set
    threading.Timer(1.0, lambda: holder.execute("COMMIT")).start()
    other = sqlite3.connect(path, isolation_level=None, timeout=0.01)
    began = time.monotonic()
    engine.sqlite_pragmas(other)
    assert time.monotonic() - began > 0.9
    assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    other.close()
    holder.close()


def test_refused_connection_fails_fast_and_hides_the_password():
    url = f"postgresql://tuner:secret@127.0.0.1:{_free_port()}/tuner"
    start = time.monotonic()
    with pytest.raises(StorageError) as caught:
        open_repository(url)
    assert time.monotonic() - start < 5
    text = str(caught.value)
    assert text.startswith("cannot open database postgresql://tuner:***@127.0.0.1")
    assert "refused" in text.lower() and "secret" not in text and "\n" not in text


def test_a_silent_server_times_out(monkeypatch):
    """A server that accepts TCP but never answers must not hang the tuner."""
    monkeypatch.setattr(engine, "CONNECT_TIMEOUT_S", 2)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(StorageError, match="cannot open database"):
            open_repository(f"postgresql://tuner@127.0.0.1:{port}/tuner")
        assert time.monotonic() - start < 10


def test_missing_sqlite_file_names_the_file_a_url_would_create(tmp_path):
    from storage import missing_sqlite_file, open_repository

    path = tmp_path / "t.db"
    for url in (f"sqlite:///{path}", f"sqlite:///file:{path}?mode=ro&uri=true"):
        assert missing_sqlite_file(url) == path
    open_repository(f"sqlite:///{path}").close()
    for url in (f"sqlite:///{path}", f"sqlite:///file:{path}?mode=ro&uri=true", "sqlite://",
                "sqlite:///:memory:", "postgresql://nobody@127.0.0.1:1/x", "not a url"):
        assert missing_sqlite_file(url) is None, url


def test_a_server_connection_dropped_while_idle_is_replaced_and_a_busy_one_is_not_pinged(url, monkeypatch):
    """PostgreSQL: the pool pings a connection idle ``PING_IDLE_S`` or more before its
    transaction (one the server dropped is replaced: the call succeeds); one used again sooner
    goes without the ping's round trip."""
    if not url.startswith("postgresql"):
        pytest.skip("SQLite has no server to drop a connection")
    from sqlalchemy import event, text

    repo = open_repository(url)
    try:
        statements = []
        event.listen(repo.engine, "before_cursor_execute",
                     lambda _c, _cur, statement, *_: statements.append(statement))
        pings = []
        original = repo.engine.dialect.do_ping
        monkeypatch.setattr(repo.engine.dialect, "do_ping", lambda conn: pings.append(1) or original(conn))
        assert repo.studies() == []
        assert repo.studies() == [] and pings == []  # used again at once: no ping
        with repo.engine.connect() as connection:  # the pooled connection, as a server drops it
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar()
        admin = engine.make_engine(url)
        with admin.connect() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            connection.commit()
        admin.dispose()
        monkeypatch.setattr(engine, "PING_IDLE_S", 0.0)
        assert repo.studies() == []  # pinged, found dead, replaced
        assert len(pings) == 1
        with repo.engine.connect() as connection:
            assert connection.execute(text("SELECT pg_backend_pid()")).scalar() != pid
    finally:
        repo.close()


def _tables(url: str) -> list[str]:
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return sorted(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def test_another_programs_database_is_refused_and_left_as_it_was(url):
    """A database with tables and none of ours (another program's) is refused before anything
    writes: no table added, on SQLite not a byte changed (not even the switch to WAL)."""
    from pathlib import Path

    from sqlalchemy import create_engine, text

    from storage import check_database, open_reader

    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"))
        connection.execute(text("INSERT INTO customers VALUES (1, 'ada')"))
        connection.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else None
    before = path.read_bytes() if path else None
    shown = engine.url.render_as_string(hide_password=True)
    line = (f"cannot open database {shown}: not a tuner database: it holds 2 tables of another program "
            "(customers, orders) and none of ours")
    for opener in (open_repository, check_database, open_reader):
        with pytest.raises(StorageError) as caught:
            opener(url)
        assert str(caught.value) == line
    assert _tables(url) == ["customers", "orders"]
    if path is not None:
        assert path.read_bytes() == before and sorted(path.parent.iterdir()) == [path]


def test_a_database_of_optunas_tables_alone_is_shared(url):
    """Optuna's tables are not another program's: our copy for optuna-dashboard lives beside ours
    (tuner.study.dashboard), and ours go beside an Optuna storage's."""
    import optuna

    optuna.storages.RDBStorage(url).engine.dispose()
    open_repository(url).close()
    assert {"studies", "trials", "tuner_studies", "tuner_alembic_version"} <= set(_tables(url))
