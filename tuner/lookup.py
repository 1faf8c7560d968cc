"""A family and a problem as a caller names them, found or refused in one line.

    from tuner import lookup

    fam = lookup.family("attention")
    problem = lookup.problem(fam, "4,16,4096,128", "fp16", {"causal": True})

Every refusal is a :class:`tuner.UsageError` whose text is one line.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from templates.family import KernelFamily, Problem, TemplateError
from tuner.errors import UsageError, first_line


def family(ref: str | KernelFamily) -> KernelFamily:
    """The family ``ref`` names (an installed entry point's or a registered name, a path to a
    folder or .py file that defines FAMILY, or ``module:ATTR``); a family is itself."""
    from templates import get_family

    try:
        return get_family(ref)
    except (TemplateError, LookupError) as error:
        raise UsageError(first_line(error)) from None


def problem(fam: KernelFamily, shape: str | Sequence[int], dtype: str,
            flags: Mapping[str, Any] | None = None) -> Problem:
    """``fam``'s problem of that shape (text or numbers), dtype and flags (the family's own:
    attention's ``causal``)."""
    try:
        return fam.parse_problem(shape, dtype, flags)
    except (TemplateError, ValueError, TypeError) as error:
        raise UsageError(first_line(error)) from None
