"""Bring a database's ``tuner_*`` tables up to the schema of this version, with Alembic.

The Alembic configuration is built in code: the scripts live in ``storage/migrations`` (shipped
as package data) and the version is kept in ``tuner_alembic_version``, never in Optuna's own
``alembic_version`` table of the same database. Upgrading only ever adds; it never drops data.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "tuner_alembic_version"
LOCK_KEY = 0x7475_6E65_7201  # pg_advisory_xact_lock key of our migrations ("tuner" + 1)


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for our scripts; ``env.py`` runs on ``connection`` when one is given."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this version of the package knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at (None when our tables were never created)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def refuse_newer(current: str | None) -> None:
    """RuntimeError when ``current`` is a revision this version does not know (a newer one's)."""
    script = ScriptDirectory.from_config(alembic_config())
    if current is not None and current not in {s.revision for s in script.walk_revisions()}:
        raise RuntimeError(
            f"the database's tuner schema is at revision {current}, newer than this "
            f"version of the tuner knows (head {head_revision()})"
        )


def upgrade(engine: Engine) -> None:
    """Run every migration the database has not had yet (a no-op when it is up to date).

    One migrator at a time: SQLite takes its write lock at BEGIN IMMEDIATE, PostgreSQL an
    advisory lock, so processes opening a new database together wait for each other. A database
    already at our head is only read (no lock): opening it never waits on the writers of a
    running study (a reader beside two busy coordinators waited out SQLite's 30 s busy timeout).

    Raises:
        RuntimeError: the database was written by a newer version (a revision we do not know).
    """
    with engine.connect() as connection, connection.begin():
        current = current_revision(connection)
    refuse_newer(current)
    if current == head_revision():
        return
    with engine.connect().execution_options(sqlite_begin="BEGIN IMMEDIATE") as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:  # SQLite's way to rebuild a table others refer to: foreign keys off, checked after
            _sqlite_foreign_keys(connection, False)
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
                current = current_revision(connection)
                refuse_newer(current)
                if current != head_revision():
                    command.upgrade(alembic_config(connection), "head")
                    if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first():
                        raise RuntimeError("the migration left rows whose foreign keys point nowhere")
        finally:
            if sqlite:
                _sqlite_foreign_keys(connection, True)


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    """PRAGMA foreign_keys, outside any transaction (inside one SQLite ignores it): through the
    driver's connection, which runs in autocommit (storage.engine)."""
    connection.connection.driver_connection.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
