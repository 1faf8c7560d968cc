"""Open a database by URL: build the engine, bring the schema up to date, hand out a Repository.

    from storage import open_repository

    repo = open_repository()                                  # $TUNER_DB or ./tuner.db
    repo = open_repository("postgresql://tuner@db.lab/tuner")  # shared with Optuna's tables

SQLite and PostgreSQL are the databases this package is tested on.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError

from storage.errors import StorageError, driver_message
from storage.migrate import current_revision, head_revision, refuse_newer, upgrade
from storage.repository import Repository

# PostgreSQL's driver is an extra: SQLite users need none.
POSTGRES_DRIVER = ("PostgreSQL's driver is not installed: pip install 'kernel-tuner-service[postgres]' "
                   "(psycopg, for postgresql:// and postgresql+psycopg:// URLs)")
CONNECT_TIMEOUT_S = 5  # a server that does not answer fails in seconds, never hangs
# How long a SQLite writer waits for another's write lock (several coordinators, or studies, on
# one file: each commit holds it for milliseconds, a migration or a slow disk for longer).
SQLITE_BUSY_TIMEOUT_S = 30
# A server's connection idle this long is pinged before use (a server drops idle connections,
# or restarts); one used again sooner is not: a coordinator's transactions follow each other
# within milliseconds, and a ping each cost it a round trip (a claim checked its connection out in
# 0.3-0.8 ms of its 5-15 ms).
PING_IDLE_S = 1.0
# Optuna's tables: the copy optuna-dashboard reads lives in our database (tuner.study.dashboard), and a
# database of Optuna's alone is one we may share (ours go beside them, our version in a table of ours).
OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_system_attributes", "study_user_attributes",
    "trial_heartbeats", "trial_intermediate_values", "trial_params", "trial_system_attributes",
    "trial_user_attributes", "trial_values", "trials", "version_info"})


def default_url() -> str:
    """``$TUNER_DB`` if set, else a SQLite file ``tuner.db`` in the current directory."""
    return os.environ.get("TUNER_DB") or f"sqlite:///{Path.cwd() / 'tuner.db'}"


def open_repository(url: str | None = None) -> Repository:
    """Connect to ``url`` (None: :func:`default_url`), create or upgrade our tables, and return
    a :class:`Repository`. Existing data is never dropped.

    Raises:
        StorageError: the URL is malformed, the driver is missing, the server does not answer,
            the database was written by a newer version of the tuner, or it is another
            program's (:func:`check_database`).
    """
    url = url or default_url()
    check_database(url)  # another program's database, or a newer version's: refused before any write
    engine = make_engine(url)
    shown = engine.url.render_as_string(hide_password=True)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        upgrade(engine)
    except Exception as error:  # driver, SQLAlchemy and Alembic errors alike
        engine.dispose()
        raise StorageError(f"cannot open database {shown}: {driver_message(error)}") from error
    return Repository(engine)


def open_reader(url: str | None = None) -> Repository:
    """A :class:`Repository` at ``url`` that only reads: no table is created or migrated, and
    every connection refuses writes (SQLite ``PRAGMA query_only``, PostgreSQL read-only
    transactions). For a process that serves what others store (``tuner serve``).

    Raises:
        StorageError: as :func:`open_repository`, and where the database holds no tuner tables
            or was written by an older version (its schema is not this version's; any other
            ``tuner`` command upgrades it) or a newer one.
    """
    url = url or default_url()
    engine = make_engine(url, read_only=True)
    shown = engine.url.render_as_string(hide_password=True)
    try:
        with engine.connect() as connection:
            current = our_revision(connection, empty=False)
        head = head_revision()
        if current != head:
            raise RuntimeError(
                f"its tuner schema is at revision {current}, older than this version's ({head}); "
                "a read-only reader does not migrate it: run `tuner studies --db URL` once to upgrade it")
    except Exception as error:  # driver, SQLAlchemy and Alembic errors alike
        engine.dispose()
        raise StorageError(f"cannot open database {shown}: {driver_message(error)}") from error
    return Repository(engine)


def open_writer(url: str | None = None) -> Repository:
    """A :class:`Repository` at ``url`` that writes, but creates and migrates nothing: for a
    server that serves what others store and keeps its own job queue in it (``tuner serve``).

    Raises:
        StorageError: as :func:`open_reader`.
    """
    url = url or default_url()
    engine = make_engine(url)
    shown = engine.url.render_as_string(hide_password=True)
    try:
        with engine.connect() as connection:
            current = our_revision(connection, empty=False)
        if current != head_revision():
            raise RuntimeError(f"its tuner schema is at revision {current}, not this version's ({head_revision()})")
    except Exception as error:  # driver, SQLAlchemy and Alembic errors alike
        engine.dispose()
        raise StorageError(f"cannot open database {shown}: {driver_message(error)}") from error
    return Repository(engine)


def check_database(url: str | None = None) -> None:
    """StorageError (the line :func:`open_repository` gives) where the database at ``url`` cannot
    be opened (no server, not a database), was written by a newer version of the tuner, or is
    another program's (:func:`our_revision`). It is only read, through a read-only connection:
    nothing is created or changed, not even SQLite's journal mode. A SQLite file that does not
    exist yet passes where its folder does (opening it creates it)."""
    url = url or default_url()
    missing = missing_sqlite_file(url)
    if missing is not None:
        if not missing.parent.is_dir():  # as SQLite says it, once Ray has started and the study opens
            shown = make_url(url).render_as_string(hide_password=True)
            raise StorageError(f"cannot open database {shown}: unable to open database file "
                               f"(no folder {missing.parent})")
        return
    engine = make_engine(url, read_only=True)
    try:
        with engine.connect() as connection:
            our_revision(connection, empty=True)
    except Exception as error:  # driver, SQLAlchemy and Alembic errors alike
        shown = engine.url.render_as_string(hide_password=True)
        raise StorageError(f"cannot open database {shown}: {driver_message(error)}") from error
    finally:
        engine.dispose()


def our_revision(connection: Connection, *, empty: bool) -> str | None:
    """The revision of our tables in the database of ``connection`` (None: it holds none).

    Raises:
        RuntimeError: it was written by a newer version of the tuner; or it holds no tuner
            tables and others' (another program's database, which we must not add to); or, unless
            ``empty`` (a writer may create our tables), it holds no tables at all.
    """
    current = current_revision(connection)
    refuse_newer(current)
    if current is not None:
        return current
    others = sorted(name for name in inspect(connection).get_table_names()
                    if not name.startswith("tuner_") and name not in OPTUNA_TABLES)
    if others:
        tables = f"{len(others)} table{'s' if len(others) > 1 else ''}"
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise RuntimeError(f"not a tuner database: it holds {tables} of another program ({shown}) and none of ours")
    if not empty:
        raise RuntimeError("it holds no tuner tables (nothing was tuned into it)")
    return None


def missing_sqlite_file(url: str) -> Path | None:
    """The file a SQLite ``url`` names, where it does not exist (opening it would create it);
    None for any other URL, an in-memory one, one that is not a URL, or a file that exists."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # open_repository says what is wrong with it
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if str(parsed.query.get("uri", "")).lower() in ("true", "1"):  # sqlite:///file:PATH?mode=ro&uri=true
        if parsed.query.get("mode") == "memory":
            return None
        database = database.removeprefix("file:").split("?")[0]
    path = Path(database)
    return None if path.exists() else path


def make_engine(url: str, *, read_only: bool = False) -> Engine:
    """An engine for ``url`` with short connect timeouts and SQLite made transactional;
    ``read_only``: every connection refuses writes."""
    try:
        parsed = make_url(url)
    except ArgumentError as error:
        raise StorageError(f"cannot open database {url!r}: not a database URL") from error
    options: dict[str, Any] = {
        "json_serializer": _dump_json,
        "connect_args": _connect_args(parsed, read_only),
    }
    try:
        engine = create_engine(parsed, **options)
    except Exception as error:  # unknown dialect, missing driver module, bad options
        shown = parsed.render_as_string(hide_password=True)
        if isinstance(error, ImportError) and parsed.get_backend_name() == "postgresql":
            raise StorageError(f"cannot open database {shown}: {POSTGRES_DRIVER} ({driver_message(error)})") from error
        raise StorageError(f"cannot open database {shown}: {driver_message(error)}") from error
    if engine.dialect.name == "sqlite":
        _make_sqlite_transactional(engine, read_only=read_only)
    else:
        _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's ``pool_pre_ping``, for connections idle ``PING_IDLE_S`` or more: a dead one
    is replaced before its transaction starts (the pool tries again on DisconnectionError)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as error:  # the driver's own error: the connection is gone
            raise DisconnectionError(driver_message(error)) from error
        if not alive:
            raise DisconnectionError("the database did not answer a ping")


def _dump_json(value: Any) -> str:
    # NaN and Infinity are not JSON; PostgreSQL refuses them, so SQLite must too.
    return json.dumps(value, allow_nan=False)


def _connect_args(url: URL, read_only: bool = False) -> dict[str, Any]:
    backend = url.get_backend_name()
    if backend == "postgresql":
        args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}  # libpq rounds under 2 up to 2
        if read_only:  # beside the URL's own options (a search_path, say), which this replaces
            given = url.query.get("options", "")
            given = " ".join(given) if isinstance(given, tuple) else given
            args["options"] = f"{given} -c default_transaction_read_only=on".strip()
        return args
    if backend == "sqlite":
        return {"timeout": SQLITE_BUSY_TIMEOUT_S}  # seconds to wait on another writer's lock
    return {}


def absolute_sqlite(url: str) -> str:
    """A SQLite URL with a relative path made absolute (another process need not share the cwd);
    other URLs unchanged."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return url
    return parsed.set(database=str(Path(parsed.database).resolve())).render_as_string(hide_password=False)


def use_sqlite_pragmas(engine: Engine) -> None:
    """Give every new connection of ``engine`` (another library's, e.g. Optuna's) the pragmas
    of :func:`sqlite_pragmas` where it is SQLite; the connections it holds are made anew."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", lambda connection, _record: sqlite_pragmas(connection))
        engine.dispose()


def use_sqlite_writer(engine: Engine) -> None:
    """Make ``engine`` (another library's, e.g. Optuna's) a writer that shares a SQLite file with
    ours: our pragmas, our busy timeout, and every transaction ``BEGIN IMMEDIATE``, so that it
    waits for another writer's lock instead of failing where a read turns into a write (in WAL
    mode that fails at once, whatever the timeout). Other engines unchanged."""
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        sqlite_pragmas(dbapi_connection)
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def sqlite_pragmas(dbapi_connection: Any) -> None:
    """Write-ahead logging, synced at checkpoints: for every connection to a SQLite database,
    ours and Optuna's (:func:`tuner.study.search.optuna_storage`).

    In WAL mode a commit appends to one file instead of rewriting a rollback journal, and readers
    no longer block the writer (a study's ask/tell loop ran twice as fast). ``synchronous=NORMAL``
    drops the fsync from each commit: a commit survives the process being killed, and the file is
    never corrupted, but the last commits may be lost if the machine itself loses power. A
    study's writer made about five commits a trial, 2.5 ms each with the fsync.
    """
    cursor = dbapi_connection.cursor()
    # as long as a writer may make us wait: "locked" is another connection's lock (a checkpoint,
    # a recovery after a killed run), not a database that does not answer (CONNECT_TIMEOUT_S's
    # 5 s ran out under load: a run started right after a killed one failed so in CI)
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:  # a new file's switch to WAL does not wait on the busy timeout: connections that
            cursor.execute("PRAGMA journal_mode=WAL")  # open a new database together retry it
            break
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _make_sqlite_transactional(engine: Engine, *, read_only: bool = False) -> None:
    """Foreign keys on, write-ahead logging, and real BEGIN/SAVEPOINT (pysqlite's own handling
    breaks both). ``read_only``: ``PRAGMA query_only`` instead of the journal pragmas (a reader
    changes nothing, not even the journal mode; a tuner database is in WAL mode already).

    See "Serializable isolation / Savepoints / Transactional DDL" in SQLAlchemy's SQLite notes.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        if read_only:
            cursor.execute("PRAGMA query_only=ON")
        cursor.close()
        if not read_only:
            sqlite_pragmas(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # execution_options(sqlite_begin="BEGIN IMMEDIATE") takes the write lock up front
        connection.exec_driver_sql(connection.get_execution_options().get("sqlite_begin", "BEGIN"))
