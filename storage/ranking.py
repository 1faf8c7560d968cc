"""What trials are ranked by: the median normalized to the study's reference GPU where several
GPUs measured the study, else the median::

    ranked_ms(1.10, 1.144)                                    # 1.10: normalized, several GPUs
    ranked_ms(None, 1.12)                                     # 1.12: one GPU, the median
    select(func.min(ranked_ms_sql(Trial.normalized_ms, Trial.median_ms)))  # the same, in SQL

The best of a problem, the study's best in its summary, the value told to the sampler, an
exported Optuna trial's value and the re-timing's candidates all rank by this.
"""

from __future__ import annotations

from typing import Any


def ranked_ms(normalized_ms: float | None, median_ms: float | None) -> float | None:
    """``normalized_ms`` where there is one (several GPUs), else ``median_ms``."""
    return normalized_ms if normalized_ms is not None else median_ms


def ranked_ms_sql(normalized_ms: Any, median_ms: Any) -> Any:
    """:func:`ranked_ms` of two SQL columns (or expressions), as one SQL expression."""
    from sqlalchemy import func  # here: the rest of this module is read without SQLAlchemy

    return func.coalesce(normalized_ms, median_ms)
