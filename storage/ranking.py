"""What trials are ranked by: the median normalized to the study's reference GPU where several
GPUs measured the study, else the median::

    ranked_ms(1.10, 1.144)                                    # 1.10: normalized, several GPUs
    ranked_ms(None, 1.12)                                     # 1.12: one GPU, the median
    select(func.min(ranked_ms_sql(TrialRow.normalized_ms, TrialRow.median_ms)))  # the same, in SQL

The best of a problem, the study's best in its summary, the value told to the sampler, an
exported Optuna trial's value and the re-timing's candidates all rank by this.

Each value carries an interval (``interval_ms``, a half-width): half its repetitions' IQR (at the
power cap the clocks switch between states within one timing: on two H200s a 0.42 ms kernel's
repetitions had an IQR of 17% of the median, and such a config's median moved 13-15% between
timings, 2026-11-28), the drift of the anchor around it on its GPU (several GPUs,
``tuner.study.normalize``), and a floor for what moves between two timings of one config: at the 700 W cap an H100's or H200's SM clock moved
between about 1,400 and 1,980 MHz from one timing to the next, and one config's median by 1-3%
(docs/BENCHMARKS.md, "Tuner throughput on GPUs"). Timed interleaved with the others on one GPU
(the final re-timing), every config meets the same clocks: two GPUs' in-turns timings of the same
configs agreed within 0.17-0.54%, so a re-timed value's floor is smaller. Two values whose
intervals overlap are a tie (:func:`tied`).
"""

from __future__ import annotations

import math
from typing import Any

SEARCH_FLOOR = 0.01  # a search's timing of a config: 1% of it moves from one timing to the next
RETIMED_FLOOR = 0.0025  # timed interleaved, beside the others on one GPU


def ranked_ms(normalized_ms: float | None, median_ms: float | None) -> float | None:
    """``normalized_ms`` where there is one (several GPUs), else ``median_ms``."""
    return normalized_ms if normalized_ms is not None else median_ms


def ranked_ms_sql(normalized_ms: Any, median_ms: Any) -> Any:
    """:func:`ranked_ms` of two SQL columns (or expressions), as one SQL expression."""
    from sqlalchemy import func  # here: the rest of this module is read without SQLAlchemy

    return func.coalesce(normalized_ms, median_ms)


def interval_ms(value_ms: float | None, iqr_ms: float | None, repetitions: int | None, *,
                drift: float | None = None, floor: float = SEARCH_FLOOR) -> float | None:
    """The half-width of ``value_ms``'s interval: half the repetitions' IQR (``iqr_ms``, scaled as
    the value is; ``repetitions`` is kept for the callers' sake: with clocks that switch within a
    timing, more repetitions do not narrow it), ``drift`` (relative: the anchor's around it) and
    ``floor`` (relative) added in quadrature. None without a value."""
    if value_ms is None or not value_ms > 0:
        return None
    spread = iqr_ms / (2 * value_ms) if iqr_ms and repetitions else 0.0
    return value_ms * math.sqrt(spread ** 2 + (drift or 0.0) ** 2 + floor ** 2)


def tied(a_ms: float, a_interval: float | None, b_ms: float, b_interval: float | None) -> bool:
    """Whether two values are within their intervals of each other (a difference the noise
    explains)."""
    return abs(a_ms - b_ms) <= (a_interval or 0.0) + (b_interval or 0.0)
