"""How many measurements each GPU actor holds at once: the one it runs and those queued behind
it, so that it goes from one to the next without waiting for the coordinator::

    depth = ActorDepth()
    depth.entered(now); ...; depth.left(now)   # the coordinator in the pool (poll, serve)
    depth.measured(gpu_seconds)                 # a trial came back
    depth.value                                 # 2 to 4

A GPU idles when the coordinator stays away from the pool (asking, storing) longer than the
trials queued on it last. The depth covers twice the 90th percentile of the coordinator's last
absences with a short trial, the 10th percentile of the last trials' GPU times:
``1 + ceil(2 * absence / trial)``, between ``MIN_DEPTH`` and ``MAX_DEPTH``. A short trial, not
the median: a trial stopped early (``workers.kernel_run.EARLY_REPS``) takes a fifth of a full one or
less, and one trial in five or more stops early; with the median (a quarter second) two real
GPUs kept one trial queued, and a GPU whose queued trial stopped early idled until the
coordinator came back from an ask of TPE (60-150 ms; 0.8 s a study on two H200s). Trials of
30 ms and a coordinator feeding 64 GPUs raise it too. A deeper queue costs the end of a study:
a GPU's last trials cannot move to another GPU that has run out.
"""

from __future__ import annotations

import math
from collections import deque

MIN_DEPTH = 2
MAX_DEPTH = 4
WINDOW = 64  # absences and trials remembered
SAMPLES = 8  # of each, before the depth moves from MIN_DEPTH
HOLD_SHARE = 0.5  # of the coordinator's median absence, a collect sent as it leaves gathers for


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

    def hold(self) -> float:
        """How long a collect of results sent as the coordinator leaves should gather before it
        answers: half its median absence, so that the answer is there when it comes back (0
        until ``SAMPLES`` absences are known)."""
        if len(self._absences) < SAMPLES:
            return 0.0
        return HOLD_SHARE * _percentile(self._absences, 0.5)

    def _update(self) -> None:
        if len(self._absences) < SAMPLES or len(self._trials) < SAMPLES:
            return
        absence, trial = _percentile(self._absences, 0.9), _percentile(self._trials, 0.1)
        self.value = max(self.minimum, min(self.maximum, 1 + math.ceil(2 * absence / trial)))


def _percentile(values: deque[float], q: float) -> float:
    """The value at fraction ``q`` of ``values`` in order (nearest below)."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]
