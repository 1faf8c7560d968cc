"""A trial timed interleaved with the study's anchor on the same GPU: T A T A ..., so that the
trial's time can be stated relative to the anchor's over the same milliseconds::

    m = bench.measure(binary, launch, "attention", problem,
                      timing=TimingOptions(anchor=(anchor_binary, anchor_launch)))
    m.paired.ratio          # median over the repetitions of (trial's time / the anchor's right after)
    m.paired.anchor_ms      # the anchor's median over the same repetitions

At the power cap a GPU's SM clock switches between states within one timing and whole timings
run throttled: on two H200s one config's repetitions had an IQR of 7-15% of their median, and
whole trials ran 6-14% slow, so a calibration round every few seconds cannot follow it. Timed in
pairs, both kernels meet the same clock state: the ratio moves far less than either time. The
coordinator stores a trial's normalized median as this ratio times the anchor's standard
(``tuner.study.normalize``).

``KernelRun.run(..., beside=anchor)`` loads, checks and verifies the trial as always; the anchor
is loaded beside it and launched on the same buffers, not verified again (it was, when it was
measured). Warm-up and repetitions are shared between the two (``kernel_run.time_in_turns``):
``target_ms`` covers both kernels' time and ``max_reps`` both kernels' launches, so a paired
trial costs the GPU about what a trial alone does. An anchor that cannot be loaded leaves the
trial timed alone (``paired`` None). This module holds what is the anchor's own: whether it
loaded, and the pairs' summary.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from workers.errors import LaunchError
from workers.results import Paired, timing_of

logger = logging.getLogger(__name__)


def anchor_loaded(anchor: Any) -> bool:
    """Whether the anchor (a ``workers.kernel_run.KernelRun``) loaded on this GPU; one that
    cannot leaves the trial timed alone (a dead context shows in the trial's own launches next)."""
    try:
        failure = anchor.load()
    except LaunchError as exc:
        failure = exc
    if failure is not None:
        logger.warning("the anchor could not be loaded on this GPU, the trial is timed alone: %s",
                       getattr(failure, "reason", failure))
    return failure is None


def paired_of(samples: list[float], anchor_samples: list[float]) -> Paired | None:
    """A trial's times and the anchor's, taken in turns, as their ``Paired`` summary: the
    anchor's median, and the median and IQR of each trial time over the anchor's right after."""
    ratios = [t / a for t, a in zip(samples, anchor_samples) if a > 0]
    if not ratios:
        return None
    spread = timing_of(ratios)
    return Paired(anchor_ms=float(statistics.median(anchor_samples)), ratio=spread.median_ms,
                  ratio_iqr=spread.iqr_ms, repetitions=len(ratios))
