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

The trial is loaded, checked and verified as ``KernelRun.run`` does; the anchor is loaded beside it
and launched on the same buffers, not verified again (it was, when it was measured). Warm-up
and repetitions are shared between the two: ``target_ms`` covers both kernels' time and
``max_reps`` both kernels' launches, so a paired trial costs the GPU about what a trial alone does. An anchor that cannot be loaded
leaves the trial timed alone (``paired`` None).
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

from templates.family import KernelFamily, Problem
from workers.driver import check_call, driver_api
from workers.errors import LaunchError
from workers.hold import HOLD_BATCH
from workers.results import Measurement, Paired, timing_of
from workers.timing_options import TimingOptions
from workers.kernel_run import EARLY_REPS, KernelRun, late_note

logger = logging.getLogger(__name__)


def paired_run(trial: KernelRun, anchor: KernelRun, family: KernelFamily, problem: Problem,
               timing: TimingOptions, seed: int) -> Measurement:
    """``trial`` loaded, verified and timed interleaved with ``anchor`` on the inputs of
    (``problem``, ``seed``). Raises LaunchError as ``KernelRun.run`` does; the caller releases both."""
    bench = trial.bench
    failure = trial.load()
    if failure is not None:
        return failure
    trial.attach(family, problem, seed)
    failure, validation = trial.verify(family, problem)
    samples: list[float] = []
    ratios: list[float] = []
    anchor_samples: list[float] = []
    if failure is None:
        if _loaded(anchor):
            anchor.attach(family, problem, seed)
            samples, anchor_samples = _time_pairs(trial, anchor, timing)
            ratios = [t / a for t, a in zip(samples, anchor_samples) if a > 0]
        else:
            samples = trial._time(timing.warmup_ms, timing.rep, timing.min_reps, timing.max_reps,
                                  timing.target_ms, timing.flush_l2, timing.abort_above_ms)
    trial.stage = "check"  # after any run, failed or not: the next trial needs intact inputs
    changed = bench.residents.changed()
    if changed is not None:
        return Measurement.failed("wrong", f"the kernel wrote into its input {changed!r}")
    if failure is not None:
        return failure
    abort = timing.abort_above_ms
    detail = (f"timing stopped early: median of {EARLY_REPS} repetitions above {abort:.4g} ms"
              if trial.stopped_early else "")
    if trial.late_batches:
        detail = "; ".join(filter(None, [detail, late_note(trial.late_batches)]))
    paired = None
    if ratios:
        spread = timing_of(ratios)
        paired = Paired(anchor_ms=float(statistics.median(anchor_samples)), ratio=spread.median_ms,
                        ratio_iqr=spread.iqr_ms, repetitions=len(ratios))
    assert validation is not None
    return Measurement(ok=True, timing=timing_of(samples), detail=detail, error=validation.error,
                       max_abs_error=validation.max_abs_error, paired=paired)


def _loaded(anchor: KernelRun) -> bool:
    """Whether the anchor loaded on this GPU (one that cannot leaves the trial timed alone; a
    dead context shows in the trial's own launches next)."""
    try:
        failure = anchor.load()
    except LaunchError as exc:
        failure = exc
    if failure is not None:
        logger.warning("the anchor could not be loaded on this GPU, the trial is timed alone: %s",
                       getattr(failure, "reason", failure))
    return failure is None


def _time_pairs(trial: KernelRun, anchor: KernelRun, timing: TimingOptions) -> tuple[list[float], list[float]]:
    """Warm both up, then time (trial, anchor) pairs: the trial's times and the anchor's. With
    ``abort_above_ms`` the first EARLY_REPS pairs decide, as a trial alone does."""
    estimate = trial.warm_up(timing.warmup_ms / 2) + anchor.warm_up(timing.warmup_ms / 2)
    count = timing.rep if timing.rep is not None else min(
        max(math.ceil(timing.target_ms / estimate), timing.min_reps),
        max(timing.min_reps, timing.max_reps // 2))  # as many launches as a trial alone
    flush, abort = timing.flush_l2, timing.abort_above_ms
    before = trial._read_clocks()
    first = EARLY_REPS if abort is not None and count > EARLY_REPS else count
    samples, anchor_samples = _repeat_pairs(trial, anchor, first, flush)
    if first < count:
        if statistics.median(samples) > float(abort):
            trial.stopped_early = True
        else:
            more, more_anchor = _repeat_pairs(trial, anchor, count - first, flush)
            samples, anchor_samples = samples + more, anchor_samples + more_anchor
    trial.clocks = {"before": before, "after": trial._read_clocks()}  # the stream is synchronized
    return samples, anchor_samples


def _repeat_pairs(trial: KernelRun, anchor: KernelRun, count: int, flush: bool) -> tuple[list[float], list[float]]:
    """``count`` (trial, anchor) pairs of timed launches queued behind holds of the stream, then
    their times."""
    bench = trial.bench
    ours: list[tuple[Any, Any]] = []
    theirs: list[tuple[Any, Any]] = []
    late = bench.hold.timeouts
    per_hold = max(1, HOLD_BATCH // 2)
    for first in range(0, count, per_hold):
        with trial.held():
            for _ in range(first, min(count, first + per_hold)):
                ours.append(trial.timed_launch(flush))
                theirs.append(anchor.timed_launch(flush))
    trial.stage = "timing"
    check_call("cuStreamSynchronize", driver_api().cuStreamSynchronize(bench.stream))
    trial.late_batches += bench.hold.timeouts - late
    return trial.elapsed(ours), anchor.elapsed(theirs)
