"""How a GPU worker times one trial, as one frozen value that travels with each request::

    bench.measure(binary, launch, "attention", problem, timing=TimingOptions(target_ms=150.0))

The pool sends its own with every measurement (``WorkerPool(..., timing=...)``); an incumbent's
calibration round and a candidate stopped early are the same options with a field replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimingOptions:
    """The timing of one trial: a warm-up, then timed repetitions between CUDA events."""

    warmup_ms: float = 25.0  # launches before the timed ones, about this long
    rep: int | None = None  # a fixed count of timed repetitions (None: as many as target_ms takes)
    min_reps: int = 20
    max_reps: int = 200
    target_ms: float = 300.0  # the timed repetitions take about this long together
    flush_l2: bool = True  # the L2 flushed before each timed launch
    abort_above_ms: float | None = None  # stop after the first repetitions when their median is above
    # the study's anchor (Binary, Launch), its repetitions alternating with the trial's (several
    # GPUs: workers.paired); None: the trial timed alone
    anchor: tuple[Any, Any] | None = None

    @classmethod
    def of(cls, options: "TimingOptions | dict | None") -> "TimingOptions":
        """Options as given: these, the defaults (None), or a dict of their fields."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown timing option(s): {', '.join(unknown)}")
        return cls(**options)


DEFAULT_TIMING = TimingOptions()
