"""The one error type of the storage package."""

from __future__ import annotations


class StorageError(Exception):
    """A database could not be opened, read or written (one line a person can read).

    Every SQLAlchemy, Alembic or driver error that leaves :mod:`storage` is turned into this
    type, so callers catch one class and print ``str(error)``.
    """
