"""Alembic environment of the ``tuner_*`` tables.

Run from :func:`storage.migrate.upgrade`, which hands over an open connection in
``config.attributes["connection"]``. Only our tables are looked at, so autogenerate never sees
(or drops) the tables Optuna keeps in the same database.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine

from storage.migrate import VERSION_TABLE
from storage.models import Base

config = context.config


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "table":
        return bool(name) and name.startswith("tuner_") and name != VERSION_TABLE
    return True


def run_migrations(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:  # the alembic command line: alembic -x url=sqlite:///tuner.db ...
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("give the database with: alembic -x url=DATABASE_URL ...")
    engine = create_engine(url)
    with engine.begin() as conn:
        run_migrations(conn)
    engine.dispose()
