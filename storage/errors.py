"""The one error type of the storage package, and the one line it shows of a driver's error."""

from __future__ import annotations


def driver_message(error: BaseException) -> str:
    """The driver's message of ``error`` (not SQLAlchemy's wrapper), on one line."""
    message = str(getattr(error, "orig", None) or error)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines) or type(error).__name__


class StorageError(Exception):
    """A database could not be opened, read or written (one line a person can read).

    Every SQLAlchemy, Alembic or driver error that leaves :mod:`storage` is turned into this
    type, so callers catch one class and print ``str(error)``.
    """


class ClaimRefused(StorageError):
    """A config's lease was not granted (``Repository.claim_trial``) or was lost before its result
    was stored (``Repository.record_trial`` with ``owner``). ``why``: ``"measured"`` (stored
    already), ``"held"`` (another coordinator's live lease holds it), ``"full"`` (the study's
    trial count is reached by its measured and running trials) or ``"lost"`` (the lease went stale
    and was taken over or dropped)."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why = why
