"""Progress of a running study, told through :mod:`logging` (logger ``"tuner"``).

One status line at most every ``interval`` seconds, plus one line per new best::

    42/200 measured (3 failed: compile 2, wrong 1; 5 reused, 17 invalid), 6 in flight
    | best 1.2340 ms 412.5 TFLOPS {BLOCK_M: 128, ...} | 8.1 trials/min, ETA 19m30s

The coordinator calls it; it never touches Optuna, the pool or the database.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

logger = logging.getLogger("tuner")


@dataclass
class BestSoFar:
    median_ms: float
    tflops: float | None
    params: dict[str, Any]
    number: int | None  # None while its trial is being recorded


@dataclass
class Counts:
    measured: int = 0  # sent to the GPU by this run and answered (ok or failed)
    failed: int = 0  # of those, failed
    reused: int = 0  # answered from stored results without the GPU
    invalid: int = 0  # rejected by the family's constraints, never compiled
    previous: int = 0  # measured by earlier runs of the same study
    failures: dict[str, int] = field(default_factory=dict)


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_params(params: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in params.items()) + "}"


class Progress:
    """Counts, best so far, rate and ETA of one run of a study."""

    def __init__(
        self,
        study: str,
        *,
        trials: int | None = None,
        time_budget: float | None = None,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.study = study
        self.trials = trials
        self.time_budget = time_budget
        self.interval = interval
        self.clock = clock
        self.counts = Counts()
        self.best: BestSoFar | None = None
        self.in_flight = 0
        self.started = clock()
        self._last_line = self.started

    # -- events ---------------------------------------------------------------------------------
    def resumed(self, previous: int, best: BestSoFar | None) -> None:
        self.counts.previous = previous
        self.best = best
        if previous:
            logger.info("resuming %s: %d trials already measured", self.study, previous)

    def measured(
        self,
        number: int | None,
        params: Mapping[str, Any],
        *,
        failure: str | None,
        median_ms: float | None,
        tflops: float | None,
    ) -> bool:
        """Count one GPU result; log and return True when it is the new best. ``number``: the
        stored trial's, or None while its database trial is still being written."""
        self.counts.measured += 1
        if failure is not None:
            self.counts.failed += 1
            self.counts.failures[failure] = self.counts.failures.get(failure, 0) + 1
            logger.debug("%s failed (%s) %s", _trial(number), failure, format_params(params))
            return False
        assert median_ms is not None
        if self.best is not None and median_ms >= self.best.median_ms:
            return False
        self.best = BestSoFar(median_ms, tflops, dict(params), number)
        logger.info("new best (%s): %s", _trial(number), self._best_text())
        return True

    def reused(self) -> None:
        self.counts.reused += 1

    def invalid(self) -> None:
        self.counts.invalid += 1

    def tick(self, in_flight: int, *, force: bool = False) -> None:
        """Log the status line if ``interval`` seconds passed since the last one."""
        self.in_flight = in_flight
        now = self.clock()
        if force or now - self._last_line >= self.interval:
            self._last_line = now
            logger.info("%s", self.line())

    def finish(self, status: str, reason: str) -> None:
        logger.info("%s: %s (%s)", self.study, status, reason)
        logger.info("%s", self.line())

    # -- text -----------------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def rate(self) -> float:
        """Measured trials per second in this run."""
        elapsed = self.elapsed
        return self.counts.measured / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left: the earlier of the trial budget at the current rate and the time budget."""
        etas = []
        if self.time_budget is not None:
            etas.append(max(0.0, self.time_budget - self.elapsed))
        if self.trials is not None and self.rate() > 0:
            left = max(0, self.trials - self.counts.previous - self.counts.measured)
            etas.append(left / self.rate())
        return min(etas) if etas else None

    def line(self) -> str:
        c = self.counts
        done = c.previous + c.measured
        total = f"/{self.trials}" if self.trials is not None else ""
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(c.failures.items()))
        failed = f"{c.failed} failed: {kinds}" if kinds else f"{c.failed} failed"
        text = (
            f"{done}{total} measured ({failed}; {c.reused} reused, {c.invalid} invalid), "
            f"{self.in_flight} in flight"
        )
        text += f" | best {self._best_text()}" if self.best else " | no valid result yet"
        text += f" | {self.rate() * 60:.1f} trials/min"
        eta = self.eta()
        if eta is not None:
            text += f", ETA {format_seconds(eta)}"
        return text

    def _best_text(self) -> str:
        assert self.best is not None
        tflops = f" {self.best.tflops:.1f} TFLOPS" if self.best.tflops is not None else ""
        return f"{self.best.median_ms:.4f} ms{tflops} {format_params(self.best.params)}"


def _trial(number: int | None) -> str:
    return "a trial being recorded" if number is None else f"trial {number}"
