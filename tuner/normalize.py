"""Several GPUs' timings made one set, through the incumbent::

    scale = GpuScale(reference="GPU-5b0e...")        # the GPU the final re-timing runs on
    scale.observe(round=1, gpu="GPU-5b0e...", median_ms=0.800)
    scale.observe(round=1, gpu="GPU-77aa...", median_ms=0.832)   # 4% slower
    scale.ratio("GPU-77aa...")                        # 0.9615...: 0.800 / 0.832
    scale.normalized("GPU-77aa...", 1.04)             # (1.0, 0.9615...): as the reference would time it

Two GPUs of one model differ by a few percent (clocks, temperature, power), so a study measured on
both would rank a config by where it landed. Every GPU times the study's incumbent (its best
config so far) in rounds, between its trials (``workers.calibrate``). In each round every GPU
times the same config, so the reference's median over another GPU's median is that GPU's ratio
then; a GPU's ratio is the median of its last ``window`` such ratios (a rolling estimate that
follows the GPUs' drift and ignores one odd timing). A trial's normalized median is its raw
median times its GPU's ratio at the time: the time the reference GPU would have measured. The
raw median is stored beside it and never altered.

The incumbent may change between rounds; a round's ratio comes only from its own config, timed on
the reference and on the GPU, so a new incumbent is timed on every GPU before a ratio comes
from it (until then the ratios of earlier rounds hold). A GPU with no round yet has no ratio:
the coordinator holds its results until the first round is back (``tuner.loop``), and a result
stored without one keeps its raw median as normalized and no ratio.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 5  # rounds a GPU's ratio is the median of
_ROUNDS_KEPT = 8  # rounds whose timings are kept for pairing (a GPU late for one pairs up later)


class GpuScale:
    def __init__(self, reference: str, *, window: int = WINDOW) -> None:
        self.reference = reference
        self._window = window
        self._rounds: dict[int, dict[str, float]] = {}  # round -> GPU -> its median of the incumbent
        self._ratios: dict[str, deque[float]] = {}  # GPU -> its latest ratios to the reference

    def observe(self, round: int, gpu: str, median_ms: float) -> None:
        """A GPU's median of round ``round``'s incumbent."""
        if not gpu or not median_ms > 0:
            return
        times = self._rounds.setdefault(round, {})
        if gpu in times:  # timed twice in a round (a replaced worker): the first counts
            return
        times[gpu] = median_ms
        reference = times.get(self.reference)
        if reference is not None:
            others = times.items() if gpu == self.reference else [(gpu, median_ms)]
            for other, ms in others:
                if other != self.reference:
                    self._ratios.setdefault(other, deque(maxlen=self._window)).append(reference / ms)
        for old in sorted(self._rounds)[:-_ROUNDS_KEPT]:
            del self._rounds[old]

    def ratio(self, gpu: str | None) -> float | None:
        """``gpu``'s ratio to the reference now (1 for the reference), or None before its
        first round."""
        if gpu == self.reference:
            return 1.0
        ratios = self._ratios.get(gpu or "")
        return float(statistics.median(ratios)) if ratios else None

    def normalized(self, gpu: str | None, median_ms: float) -> tuple[float, float | None]:
        """(``median_ms`` as the reference would time it, the ratio used or None)."""
        ratio = self.ratio(gpu)
        return (median_ms * ratio if ratio is not None else median_ms), ratio

    def ratios(self) -> dict[str, float]:
        """Every GPU's ratio now, the reference's included."""
        out = {self.reference: 1.0}
        out.update({gpu: r for gpu in self._ratios if (r := self.ratio(gpu)) is not None})
        return out
