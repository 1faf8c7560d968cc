"""Several GPUs' timings made one set, and each GPU's drift followed, through one anchor config::

    scale = GpuScale(reference="GPU-5b0e...")        # the GPU the final re-timing runs on
    scale.observe(round=1, gpu="GPU-5b0e...", median_ms=0.800)   # the standard: 0.800
    scale.observe(round=1, gpu="GPU-77aa...", median_ms=0.832)   # 4% slower
    scale.ratio("GPU-77aa...")                        # 0.9615...: 0.800 / 0.832
    scale.normalized("GPU-77aa...", 1.04)             # (1.0, 0.9615...): in the standard's terms
    scale.spread("GPU-77aa...")                       # half the range of its recent anchor timings, relative

Every GPU times the study's anchor (a fixed config: the first incumbent, ``workers.calibrate``) in
rounds between its trials. A trial's normalized median is its raw median times the standard
(the reference GPU's first timing of the anchor) over the median of its own GPU's latest
``window`` timings of the anchor: the time the anchor's standard says it takes, whatever GPU
measured it and whenever. So each GPU is compared with itself close in time, the reference GPU
too: at the 700 W cap one H200 of a pair ran 10% slower than the other, and a one-ratio-a-GPU
normalization against the reference's rounds moved between 0.898 and 1.074 over a 4-minute grid,
while both GPUs' clocks drifted. The raw median is stored beside it and never altered.

Once the anchor is chosen, each trial is also timed beside it on its GPU (``workers.paired``):
``paired(ratio, anchor_ms)`` then gives its normalized median as its ratio to the anchor over the
same repetitions times the standard, which follows clocks that change within one timing (at the
power cap whole trials ran 6-14% throttled while the rounds around them moved less than 2%).
The rounds still give the standard and the factor of what was timed alone.

``spread`` is the drift the anchor showed around a trial on its GPU (half the range of the recent
timings over their median), stored with the trial and part of its interval (``storage.ranking``).
A GPU with no anchor timing yet (the reference: none of the reference yet) has no ratio: the
coordinator holds its results until its first round is back (``tuner.study.loop``), and a result
stored without one keeps its raw median as normalized and no ratio. The reference's results
before its first round count as the standard's (ratio 1).
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 3  # a GPU's latest anchor timings its factor is the median of


class GpuScale:
    def __init__(self, reference: str, *, window: int = WINDOW) -> None:
        self.reference = reference
        self._window = window
        self.standard: float | None = None  # the reference GPU's first timing of the anchor, ms
        self._timings: dict[str, deque[float]] = {}  # GPU -> its latest timings of the anchor
        self._rounds: dict[str, int] = {}  # GPU -> the latest round it timed

    def observe(self, round: int, gpu: str, median_ms: float) -> None:
        """A GPU's median of the anchor in round ``round`` (a round timed twice, by a replaced
        worker: the first counts)."""
        if not gpu or not median_ms > 0 or self._rounds.get(gpu, 0) >= round:
            return
        self._rounds[gpu] = round
        if gpu == self.reference and self.standard is None:
            self.standard = median_ms
        self._timings.setdefault(gpu, deque(maxlen=self._window)).append(median_ms)

    def local(self, gpu: str | None) -> float | None:
        """The anchor's time on ``gpu`` now: the median of its latest timings, or None."""
        timings = self._timings.get(gpu or "")
        return float(statistics.median(timings)) if timings else None

    def ratio(self, gpu: str | None) -> float | None:
        """``gpu``'s factor now (the standard over its anchor's time), or None before the
        reference's and its own first round (the reference before its first: 1)."""
        local = self.local(gpu)
        if self.standard is None or local is None:
            return 1.0 if gpu == self.reference else None
        return self.standard / local

    def spread(self, gpu: str | None) -> float | None:
        """Half the range of ``gpu``'s latest anchor timings over their median (None: fewer than
        two)."""
        timings = self._timings.get(gpu or "")
        if not timings or len(timings) < 2:
            return None
        return (max(timings) - min(timings)) / (2 * statistics.median(timings))

    def normalized(self, gpu: str | None, median_ms: float) -> tuple[float, float | None]:
        """(``median_ms`` in the standard's terms, the ratio used or None)."""
        ratio = self.ratio(gpu)
        return (median_ms * ratio if ratio is not None else median_ms), ratio

    def paired(self, ratio: float, anchor_ms: float) -> tuple[float, float | None]:
        """A trial timed beside the anchor (``workers.paired``): (its median in the standard's
        terms, the factor its anchor's time over the same repetitions gives), from the median of
        its repetitions' ratios to the anchor's. Needs the standard."""
        assert self.standard is not None
        return ratio * self.standard, (self.standard / anchor_ms if anchor_ms > 0 else None)

    def ratios(self) -> dict[str, float]:
        """Every GPU's ratio now, the reference's included."""
        out = {self.reference: self.ratio(self.reference) or 1.0}
        out.update({gpu: r for gpu in self._timings if (r := self.ratio(gpu)) is not None})
        return out
