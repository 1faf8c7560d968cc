"""Peers to compare a tuned kernel with, timed in this process the way GpuBench times ours.

    from workers.peers import time_peers
    results = time_peers("attention", problem, seed=0)   # {} when torch is not installed
    results["cudnn"].median_ms, results["cudnn"].check_ms, results["triton"].tune_seconds
    results = time_peers("gemm", problem, ours=launch)    # ours timed in turns with them: results[OURS]

A family names its peers (``KernelFamily.peers``: attention's are torch's SDPA backends and an
FA2-style Triton kernel tuned by Triton's own autotuner). They run on the family's own inputs and
are validated by the family's own reference, so their error is the same metric as ours.

Timing (``HeldTimer``), as a trial times ours: warm-up, then batches of repetitions queued behind
a hold of the stream (``workers.hold``): each repetition the workers' L2 flush (a read of
``l2_flush_bytes``), a start event, the call, an end event; the GPU starts on a batch only once
the host has queued all of it, so a call's host dispatch is never timed. The peers (and our
kernel, given as ``ours``) take turns: each repetition times every one of them once, so that a
drift of the GPU's clocks between them cannot make a ratio. The median of the repetitions.
``check_ms`` is a second method's median, ``triton.testing.do_bench`` (its own L2 clearing, its
own events), where Triton is installed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from templates import get_family
from templates.family import Problem, check_outputs
from workers.gpu import l2_flush_bytes
from workers.hold import HOLD_BATCH, StreamHold
from workers.kernel_run import late_note
from workers.results import timing_of

logger = logging.getLogger(__name__)

WARMUP_CALLS = 10


@dataclass(frozen=True)
class PeerResult:
    name: str
    median_ms: float | None  # None when the peer refused the problem or cannot run here
    error: float | None
    note: str = ""  # why there is no time, or what to know about it
    check_ms: float | None = None  # triton.testing.do_bench's median: the second method
    tune_seconds: float | None = None  # the peer's own autotuning before it was timed (Triton)
    iqr_ms: float | None = None  # the timed repetitions' interquartile range
    repetitions: int = 0


class HeldTimer:
    """Times calls that queue GPU work on torch's current stream: the same hold, flush and
    events around the call alone as a trial's repetitions (``kernel_run.repeat_in_turns``)."""

    def __init__(self, torch: Any, hold: Any, flush: Callable[[int], None]) -> None:
        self._torch, self.hold, self._flush = torch, hold, flush

    def time(self, run: Callable[[], Any], reps: int) -> tuple[list[float], int]:
        """Milliseconds of each of ``reps`` calls of ``run``, and the holds that timed out."""
        samples, late = self.time_each({"run": run}, reps)
        return samples["run"], late

    def time_each(self, runs: Mapping[str, Callable[[], Any]], reps: int) -> tuple[dict[str, list[float]], int]:
        """Milliseconds of ``reps`` calls of each of ``runs``, taken in turns: each repetition
        calls every run once, in order, each behind its own flush and between its own events, in
        the same held batches. A drift of the GPU's clocks or temperature then moves every run's
        times alike, so their ratios hold (timed one after the other on an H100, one gemm kernel's
        median of 4096^3 moved by up to 10% with the clocks, and its ratio to cuBLAS's between 0.93
        and 0.98; in turns, 0.926 and 0.927: docs/BENCHMARKS.md, "Timing methods")."""
        cuda = self._torch.cuda
        late = self.hold.timeouts
        pairs: dict[str, list[tuple[Any, Any]]] = {name: [] for name in runs}
        batch = max(1, HOLD_BATCH // len(runs))
        for first in range(0, reps, batch):
            with self.hold:
                for index in range(first, min(first + batch, reps)):
                    for name, run in runs.items():
                        start, stop = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
                        self._flush(index)
                        start.record()
                        run()
                        stop.record()
                        pairs[name].append((start, stop))
        cuda.synchronize()
        times = {name: [start.elapsed_time(stop) for start, stop in p] for name, p in pairs.items()}
        return times, self.hold.timeouts - late


def do_bench_ms(run: Callable[[], Any]) -> float | None:
    """``triton.testing.do_bench``'s median of ``run`` in milliseconds; None without Triton."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return None
    return float(do_bench(run, warmup=25, rep=100, return_mode="median"))


def prepare_peers(family_name: str, problems: list[Problem]) -> None:
    """What the family's peers would do once per problem on first use, done for all of them at
    once (``KernelFamily.prepare_peers``: the attention family compiles its Triton peer's configs
    on every core, since Triton's autotuner compiles one at a time)."""
    if not problems:
        return
    start = time.perf_counter()
    get_family(family_name).prepare_peers(problems)
    logger.info("peers of %s prepared for %d problems in %.0f s", family_name, len(problems),
                time.perf_counter() - start)


OURS = "ours"  # time_peers' entry for the kernel timed in turns with the peers


def time_peers(family_name: str, problem: Problem, *, seed: int = 0, reps: int = 100,
               cross_check: bool = True, ours: Callable[[], Any] | None = None) -> dict[str, PeerResult]:
    """The family's peers (``KernelFamily.peers``) on ``problem``, each checked against the
    family's reference, then timed in turns (``HeldTimer.time_each``); empty when it has none or
    torch is missing. ``ours``: a call that queues our kernel on torch's current stream (checked
    already, by the workers), timed in the same turns and returned as the entry ``OURS``."""
    try:
        import torch
    except ImportError:
        logger.info("torch is not installed: no peers to compare with")
        return {}
    if not torch.cuda.is_available():
        return {}
    family = get_family(family_name)
    host = family.inputs(problem, seed)
    calls = family.peers(problem, host)
    if not calls:
        return {}
    timer = held_timer(torch)
    try:
        results, runs = {}, {}
        for name, call in calls.items():
            if call.run is None:
                results[name] = PeerResult(name, None, None, call.note)
                continue
            try:
                error, wrong = _checked(torch, call.run, family, problem, host)
            except RuntimeError as exc:  # the peer does not support this problem
                results[name] = PeerResult(name, None, None, str(exc).splitlines()[0][:120])
                continue
            if wrong:
                results[name] = PeerResult(name, None, error, f"wrong: {wrong}")
            else:
                results[name] = PeerResult(name, None, error, call.note, None, call.tune_seconds)
                runs[name] = call.run
        if ours is not None:
            runs = {OURS: ours, **runs}
            results[OURS] = PeerResult(OURS, None, None)
        second = {}
        for name, run in runs.items():  # each warmed up, then timed by the second method
            for _ in range(WARMUP_CALLS):
                run()
            second[name] = do_bench_ms(run) if cross_check else None
        samples, late = timer.time_each(runs, reps) if runs else ({}, 0)
        for name, run in runs.items():
            note = "; ".join(filter(None, [late_note(late) if late else "", results[name].note]))
            timing = timing_of(samples[name])
            results[name] = replace(results[name], median_ms=timing.median_ms, note=note, check_ms=second[name],
                                    iqr_ms=timing.iqr_ms, repetitions=timing.repetitions)
        return results
    finally:
        torch.cuda.synchronize()
        timer.hold.close()


def held_timer(torch: Any) -> HeldTimer:
    """A HeldTimer on torch's current stream, with the workers' flush (close ``timer.hold`` after)."""
    stream = torch.cuda.current_stream()
    flush = torch.zeros(l2_flush_bytes(torch.cuda.get_device_properties(0).L2_cache_size),
                        dtype=torch.int8, device="cuda")
    hold = StreamHold(stream.cuda_stream, torch.cuda.get_device_capability())

    def flush_l2(index: int) -> None:  # the workers' flush: a read of the buffer
        hold.flush(flush.data_ptr(), flush.numel())

    return HeldTimer(torch, hold, flush_l2)


def _checked(torch: Any, run: Callable[[], Any], family: Any, problem: Problem,
             host: dict[str, np.ndarray]) -> tuple[float | None, str]:
    """``run``'s output against the family's reference: (its error, why it is wrong or "")."""
    out = run()
    torch.cuda.synchronize()
    spec = family.outputs(problem)[0]  # the raw elements, as the family's check reads ours
    bits = out.contiguous().view(torch.uint8).cpu().numpy().view(spec.dtype).reshape(spec.shape)
    check = check_outputs(family, problem, host, {spec.name: bits})
    return check.error, "" if check.ok else check.reason


def _time_one(torch: Any, timer: HeldTimer, name: str, run: Callable[[], Any], family: Any,
              problem: Problem, host: dict[str, np.ndarray], reps: int, cross_check: bool) -> PeerResult:
    """Check ``run``'s output against the family's reference, then time it alone, both ways."""
    error, wrong = _checked(torch, run, family, problem, host)
    if wrong:
        return PeerResult(name, None, error, f"wrong: {wrong}")
    for _ in range(WARMUP_CALLS):
        run()
    samples, late = timer.time(run, reps)
    check_ms = do_bench_ms(run) if cross_check else None
    timing = timing_of(samples)
    return PeerResult(name, timing.median_ms, error, late_note(late) if late else "", check_ms,
                      iqr_ms=timing.iqr_ms, repetitions=timing.repetitions)
