"""The results database as the tuner's calls use it: its URL, a repository opened for one call,
and storage errors turned into one-line :class:`tuner.DatabaseError` s.

    from tuner import database

    with database.repository(database.url(db)) as repo:
        winner = database.call(lambda: repo.best(...))

``storage`` (and with it SQLAlchemy) is imported when a call opens the database, not before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from tuner.errors import DatabaseError, first_line

T = TypeVar("T")


def url(db: str | None) -> str:
    """``db``, or when None the default: ``$TUNER_DB``, else ``./tuner.db``."""
    from storage import default_url

    return db or default_url()


def check(url: str) -> None:
    """A DatabaseError where the database at ``url`` cannot be opened, is another program's, or
    was written by a newer version of the tuner: the line opening it would give, found by reading
    it only (before Ray starts, in a second where Ray takes ten); nothing created or changed. A
    SQLite file that does not exist yet passes."""
    from storage import StorageError, check_database

    try:
        check_database(url)
    except StorageError as error:
        raise DatabaseError(first_line(error)) from None


@contextmanager
def repository(url: str, *, create: bool = True) -> Iterator[Any]:
    """A ``storage.Repository`` at ``url``, closed on the way out. ``create=False`` (the calls
    that only read) refuses a SQLite file that does not exist rather than create an empty one."""
    from storage import open_repository

    with _opened(url, open_repository, refuse_missing=not create) as repo:
        yield repo


@contextmanager
def reader(url: str) -> Iterator[Any]:
    """A ``storage.Repository`` at ``url`` that only reads (``storage.open_reader``): a missing
    SQLite file, a database without our tables, or of another version's schema, is refused in
    one line; nothing is created or migrated."""
    from storage import open_reader

    with _opened(url, open_reader, refuse_missing=True) as repo:
        yield repo


@contextmanager
def writer(url: str) -> Iterator[Any]:
    """A ``storage.Repository`` at ``url`` that writes but creates and migrates nothing
    (``storage.open_writer``): refused in one line as :func:`reader` refuses."""
    from storage import open_writer

    with _opened(url, open_writer, refuse_missing=True) as repo:
        yield repo


@contextmanager
def _opened(url: str, opener: Callable[[str], Any], *, refuse_missing: bool) -> Iterator[Any]:
    from storage import StorageError, missing_sqlite_file

    missing = missing_sqlite_file(url) if refuse_missing else None
    if missing is not None:
        raise DatabaseError(f"no database at {missing}: nothing is stored there "
                            "(check --db or $TUNER_DB, or tune first)")
    try:
        repo = opener(url)
    except StorageError as error:
        raise DatabaseError(first_line(error)) from None
    try:
        yield repo
    finally:
        repo.close()


def call(fn: Callable[[], T]) -> T:
    """Run ``fn``; a ``storage.StorageError`` becomes a one-line DatabaseError."""
    from storage import StorageError

    try:
        return fn()
    except StorageError as error:
        raise DatabaseError(first_line(error)) from None
