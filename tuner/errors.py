"""The errors of the tuner: one root, a handful of subclasses, each one line a person can read.

    try:
        tuner.best("attention", "4,16,4096,128", "fp16")
    except tuner.TunerError as error:
        print(f"tuner: error: {error}")

The CLI turns every :class:`TunerError` into ``tuner: error: <message>`` and exit code 2.
"""

from __future__ import annotations


class TunerError(Exception):
    """Root of every error the tuner raises on purpose (a user can act on it)."""


class UsageError(TunerError):
    """Bad input: an unknown family, a malformed shape, an unsupported dtype, a bad budget."""


class NotFound(TunerError):
    """Nothing stored for what was asked (no validated trial, no such study)."""


class NoGPU(TunerError):
    """No GPU is visible and no replay file was given."""


class DatabaseError(TunerError):
    """The database could not be opened, read or written."""


class WorkerFailure(TunerError):
    """The workers could not start (Ray unreachable, a bad replay file, every worker died)."""


class TemplateMismatch(TunerError):
    """The stored winner was measured with another version of the family's template."""


def first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s text (its type's name when it has none): what
    another package raised, told as a TunerError's message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


__all__ = ["DatabaseError", "NoGPU", "NotFound", "TemplateMismatch", "TunerError", "UsageError",
           "WorkerFailure", "first_line"]
