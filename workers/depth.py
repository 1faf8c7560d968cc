"""How many measurements each GPU actor holds at once: the one it runs and those queued behind
it, so that it goes from one to the next without waiting for the coordinator::

    depth = ActorDepth()
    depth.entered(now); ...; depth.left(now)   # the coordinator in the pool (poll, serve)
    depth.measured(gpu_seconds)                 # a trial came back
    depth.value                                 # 2 to 4

A GPU idles when the coordinator stays away from the pool (asking, storing) longer than the
trials queued on it last. The depth covers twice the 90th percentile of the coordinator's last
absences with the median of the last trials' GPU times: ``1 + ceil(2 * absence / trial)``,
between ``MIN_DEPTH`` and ``MAX_DEPTH``. Trials of a quarter second and absences of tens of
milliseconds (a few real GPUs) keep it at 2. Trials of 30 ms and a coordinator feeding 64 GPUs
raise it. A deeper queue costs the end of a study: a GPU's last trials cannot move to another
GPU that has run out.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

MIN_DEPTH = 2
MAX_DEPTH = 4
WINDOW = 64  # absences and trials remembered
SAMPLES = 8  # of each, before the depth moves from MIN_DEPTH


class ActorDepth:
    def __init__(self, *, minimum: int = MIN_DEPTH, maximum: int = MAX_DEPTH) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"actor depth: need 1 <= minimum <= maximum, not {minimum}, {maximum}")
        self.minimum, self.maximum = minimum, maximum
        self.value = minimum
        self._absences: deque[float] = deque(maxlen=WINDOW)
        self._trials: deque[float] = deque(maxlen=WINDOW)
        self._left: float | None = None

    def entered(self, now: float) -> None:
        """The coordinator came back to the pool."""
        if self._left is not None:
            self._absences.append(max(0.0, now - self._left))
            self._left = None

    def left(self, now: float) -> None:
        """The coordinator left the pool (to ask, store, report)."""
        self._left = now

    def measured(self, gpu_seconds: float) -> None:
        """A trial's GPU time (none: a screened or shared one, not counted)."""
        if gpu_seconds > 0:
            self._trials.append(gpu_seconds)
            self._update()

    def _update(self) -> None:
        if len(self._absences) < SAMPLES or len(self._trials) < SAMPLES:
            return
        absences = sorted(self._absences)
        absence = absences[int(0.9 * (len(absences) - 1))]
        trial = statistics.median(self._trials)
        self.value = max(self.minimum, min(self.maximum, 1 + math.ceil(2 * absence / trial)))
