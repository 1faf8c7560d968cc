"""The GPU side of ``tuner guard``: ours and the vendor's path on one problem, checked against
each other, then timed in turns in this process, as ``workers.peers`` times peers::

    bench = GpuBench()                                   # UsageError without torch or a GPU
    comparison = bench.compare(package, choice, problem, reps=100)
    comparison.ours.median_ms, comparison.vendor.iqr_ms, comparison.wrong
    bench.close()

The package's ``guard_calls`` makes the inputs (random, seeded) and the two calls on the current
GPU. Each call runs once and their results are compared (relative difference, the family's
tolerance); then each is warmed up and both are timed ``reps`` times in turns behind the
workers' L2 flush and stream hold (``workers.peers.held_timer``, ``HeldTimer.time_each``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from templates.family import Problem
from tuner.answers.torch_runtime import Choice
from tuner.errors import UsageError

OURS, VENDOR = "ours", "vendor"


@dataclass(frozen=True)
class Timing:
    """One side's repetitions: their median and interquartile range (milliseconds)."""

    median_ms: float
    iqr_ms: float


@dataclass(frozen=True)
class Comparison:
    """Ours against the vendor's path on one problem: both timed, or why ours was not."""

    ours: Timing | None = None
    vendor: Timing | None = None
    wrong: str = ""  # ours gave another result than the vendor's, or failed
    note: str = ""  # what to know about the timing (holds that timed out)


class GuardBench(Protocol):
    """What the guard asks of the GPU (``GpuBench``; a double in the CPU tests)."""

    def gpu_name(self) -> str:
        """The name of the GPU the calls run on."""

    def compare(self, package: ModuleType, choice: Choice, problem: Problem, reps: int) -> Comparison:
        """``choice``'s kernel (``package.kernel_for``) against the vendor's path on ``problem``
        (``package.guard_calls``): checked, warmed up, then timed ``reps`` times in turns."""

    def close(self) -> None:
        """Free what the timing holds."""


class GpuBench:
    """``GuardBench`` on torch's current GPU (close it after: it holds the flush buffer)."""

    def __init__(self) -> None:
        try:
            import torch
        except ImportError:
            raise UsageError("tuner guard needs torch installed") from None
        if not torch.cuda.is_available():
            raise UsageError("no CUDA GPU here: tuner guard times a package on the GPU it was exported for")
        self._torch = torch
        self._timer: Any = None

    def gpu_name(self) -> str:
        return str(self._torch.cuda.get_device_name())

    def compare(self, package: ModuleType, choice: Choice, problem: Problem, reps: int) -> Comparison:
        from workers.kernel_run import late_note
        from workers.peers import WARMUP_CALLS, held_timer
        from workers.results import timing_of

        torch = self._torch
        try:
            kernel = package.kernel_for(choice)
            ours, vendor, tolerance = package.guard_calls(problem.shape, problem.dtype, dict(problem.flags), kernel)
            got = ours()
            torch.cuda.synchronize()
        except Exception as error:  # compile, load or launch: ours cannot run here
            return Comparison(wrong=f"ours fails: {_first_line(error)}")
        want = vendor()
        difference = float((got.double() - want.double()).norm() / want.double().norm())
        if not difference <= tolerance:
            return Comparison(wrong=f"ours differs from the vendor's result: relative difference {difference:.2e} "
                                    f"> {tolerance:.0e}")
        for _ in range(WARMUP_CALLS):
            ours()
            vendor()
        if self._timer is None:
            self._timer = held_timer(torch)
        samples, late = self._timer.time_each({OURS: ours, VENDOR: vendor}, reps)
        timed = {name: timing_of(samples[name]) for name in (OURS, VENDOR)}
        return Comparison(Timing(timed[OURS].median_ms, timed[OURS].iqr_ms),
                          Timing(timed[VENDOR].median_ms, timed[VENDOR].iqr_ms),
                          note=late_note(late) if late else "")

    def close(self) -> None:
        if self._timer is not None:
            self._torch.cuda.synchronize()
            self._timer.hold.close()
            self._timer = None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


__all__ = ["Comparison", "GpuBench", "GuardBench", "Timing"]
