"""Kernels timed again, interleaved on one GPU: A B C A B C ..., so that whatever drifts while a
study runs (clocks, temperature, a neighbour's load) falls on every kernel alike::

    retiming = bench.retime([(binary_a, launch_a), (binary_b, launch_b)], "attention", problem)
    [m.timing.median_ms for m in retiming.measurements], retiming.clocks_before, retiming.clocks_after

Every kernel is loaded; they launch on the bench's buffers for the problem; each kernel is
checked as in a trial (``KernelRun.verify``), then warmed up. Then the rounds: in
each, every kernel is launched once, the L2 flushed before it and CUDA events around the launch
alone, the rounds queued behind holds of the stream (``workers.hold``) as a trial's repetitions
are. ``rounds`` rounds, fewer (never under MIN_ROUNDS) where they would take longer than
``max_seconds``. A kernel that fails is failed alone; a dead context fails every kernel left.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence

from templates.family import KernelFamily, Problem, Validation
from workers.driver import check_call, driver_api
from workers.errors import LaunchError
from workers.hold import HOLD_BATCH
from workers.results import Measurement, timing_of
from workers.kernel_run import KernelRun, RunBench, late_note

ROUNDS = 30  # interleaved rounds: every kernel is timed this many times
MAX_SECONDS = 2.0  # fewer rounds where ROUNDS would take longer than this
MIN_ROUNDS = 5


def round_count(rounds: int, max_seconds: float, round_ms: float) -> int:
    """``rounds``, or as many as fit in ``max_seconds`` at ``round_ms`` each (at least MIN_ROUNDS)."""
    fit = math.floor(max_seconds * 1000.0 / max(round_ms, 1e-6))
    return max(1, min(rounds, max(MIN_ROUNDS, fit)))


class RetimeBench(RunBench, Protocol):
    """What the interleaved re-timing uses of its bench (a ``workers.gpu.GpuBench``) beyond what
    its trials do: whether the context is dead, and how a driver error is classified (which
    marks it dead when it is)."""

    dead: bool

    def classify(self, exc: LaunchError, stage: str) -> Measurement: ...


def interleave(bench: RetimeBench, trials: Sequence[KernelRun], family: KernelFamily, problem: Problem,
               *, seed: int, rounds: int, max_seconds: float, warmup_ms: float,
               flush_l2: bool) -> tuple[list[Measurement], int]:
    """Each trial's outcome, in order, and the rounds timed; the caller releases the trials."""
    done: list[Measurement | None] = [None] * len(trials)
    checked: dict[int, Validation] = {}

    def step(index: int, action: Callable[[KernelRun], Measurement | None]) -> None:
        """One step of a kernel still in the race; what it returns (a failure, or at the end
        its timing) settles the kernel."""
        if done[index] is not None or bench.dead:
            return
        trial = trials[index]
        try:
            outcome = action(trial)
        except LaunchError as exc:
            outcome = bench.classify(exc, trial.stage)
        if outcome is not None:
            done[index] = outcome

    def racing() -> list[int]:
        return [i for i, m in enumerate(done) if m is None]

    def settle_rest(outcome: Measurement) -> list[Measurement]:
        for i in racing():
            done[i] = outcome
        return done  # type: ignore[return-value]

    def verify(index: int) -> Callable[[KernelRun], Measurement | None]:
        def action(trial: KernelRun) -> Measurement | None:
            failure, validation = trial.verify(family, problem)
            if validation is not None:
                checked[index] = validation
            return failure
        return action

    for i in range(len(trials)):
        step(i, lambda trial: trial.load())
    for i in racing():
        step(i, lambda trial: trial.attach(family, problem, seed))
        step(i, verify(i))
    estimates: dict[int, float] = {}
    for i in racing():
        step(i, lambda trial, i=i: estimates.__setitem__(i, trial.warm_up(warmup_ms / len(trials))))
    order = racing()
    count = round_count(rounds, max_seconds, sum(estimates.get(i, 0.0) for i in order)) if order else 0
    pairs: dict[int, list] = {i: [] for i in order}
    per_hold = max(1, HOLD_BATCH // max(1, len(order)))  # rounds queued behind one hold
    late = bench.hold.timeouts if order else 0
    for first in range(0, count, per_hold):
        if not racing() or bench.dead:
            break
        try:
            with trials[racing()[0]].held():  # any live trial's events serve for the hold's mark
                for _ in range(first, min(count, first + per_hold)):
                    for i in order:
                        step(i, lambda trial, i=i: pairs[i].append(trial.timed_launch(flush_l2)))
        except LaunchError as exc:  # the hold itself could not be queued
            settle_rest(bench.classify(exc, "timing"))
    if racing() and not bench.dead:
        try:
            check_call("cuStreamSynchronize", driver_api().cuStreamSynchronize(bench.stream))
            late = bench.hold.timeouts - late
        except LaunchError as exc:
            settle_rest(bench.classify(exc, "timing"))
    if not bench.dead:  # whether or not a kernel is left: later trials need intact inputs
        try:
            changed = bench.residents.changed()
        except LaunchError as exc:
            return settle_rest(bench.classify(exc, "check")), count
        if changed is not None:  # which kernel did is unknown here (each passed this in its trial)
            settle_rest(Measurement.failed("wrong", f"a kernel wrote into the input {changed!r}"))
    for i in racing():
        step(i, lambda trial, i=i: _timed(trial, pairs[i], checked[i], len(order), count, late))
    return settle_rest(Measurement.failed("crash", "the CUDA context died during the re-timing")), count


def _timed(trial: KernelRun, pairs: list, validation: Validation, kernels: int, rounds: int,
           late: int) -> Measurement:
    others = f"with {kernels - 1} other kernel{'s' if kernels != 2 else ''}"
    detail = f"re-timed interleaved {others} over {rounds} rounds" + (f"; {late_note(late)}" if late else "")
    return Measurement(ok=True, timing=timing_of(trial.elapsed(pairs)),
                       error=validation.error, max_abs_error=validation.max_abs_error, detail=detail)
