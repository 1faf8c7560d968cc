"""Many rows into one table in one statement, inside the session's transaction.

``insert_rows(session, Trial.__table__, rows)`` with ``rows`` plain dicts of column values, as
``session.execute(insert(table), rows)`` takes them. On PostgreSQL the rows go by ``COPY ... FROM
STDIN`` on the session's own connection: SQLAlchemy's executemany handled each row's 30 values
in Python and psycopg sent one statement a row (0.37 ms a stored trial, 0.25 a lease, in batches
of 64 on the 2-core machine: docs/scripts/db_batch_cost.py), most of a coordinator's database
time at many GPUs. Elsewhere (SQLite) the executemany stays. The values are what the columns'
types would store: JSON as its text (None as NULL where the type says so), timestamps as naive
UTC.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy import JSON, Table, insert
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session

from storage.models import CanonicalJSON, UTCDateTime


def insert_rows(session: Session, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each with the same keys) into ``table``; SQLAlchemy's DatabaseError if
    the database refuses them (``Repository._session`` turns it into a StorageError saying what
    failed, and rolls the transaction back)."""
    if not rows:
        return
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        session.execute(insert(table), rows)
        return
    columns = list(rows[0])
    convert = [_converter(table.c[name].type) for name in columns]
    names = ", ".join(f'"{name}"' for name in columns)
    raw = connection.connection.driver_connection
    try:
        with raw.cursor() as cursor, cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row([f(row[name]) for f, name in zip(convert, columns)])
    except raw.Error as exc:  # psycopg's own: wrapped as SQLAlchemy would (the session says what failed)
        raise DatabaseError(f'COPY "{table.name}"', None, exc) from exc


def _converter(kind: Any) -> Callable[[Any], Any]:
    """What a value of a column of this type is sent as."""
    if isinstance(kind, UTCDateTime):
        return _naive_utc
    if isinstance(kind, CanonicalJSON):
        return lambda v: kind.process_bind_param(v, None)
    if isinstance(kind, JSON):
        null = None if kind.none_as_null else "null"
        return lambda v: null if v is None else json.dumps(v, allow_nan=False)  # as the engine's
    return lambda v: v


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value
