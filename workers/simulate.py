"""Simulated GPUs: replay workers that occupy a slot for each trial's GPU time, many to a process.

A study on 8, 32 or 128 GPUs, on one machine without any::

    start_ray(resources={"sim_gpu": 64})                    # Ray's custom resource, one a GPU
    with WorkerPool("attention", problem, replay="attn.json", simulate_gpus=64) as pool:
        ...                                                  # 64 slots, each one GPU's time
        pool.busy_intervals()                                # [(gpu, start, end), ...] monotonic

Design. A Ray actor process per GPU does not fit a small machine (128 of them, 2 cores), so one
async actor, :class:`SimulatedGpus`, hosts up to ``GPUS_PER_HOST`` simulated GPUs and holds
``{"sim_gpu": count}`` of Ray's custom resource. Each GPU is a FIFO lock in its event loop: a
measurement takes its GPU's lock, sleeps for the trial's GPU time (:func:`gpu_time`) and
answers the recorded measurement (:class:`workers.replay.ReplayBench`), so a GPU runs one trial
at a time in the order the pool sent them, as a GPU actor does. The pool sees one slot per
simulated GPU (:class:`SimulatedGpu`, called as an actor handle is) and drives them as it drives
real GPU actors behind node agents (:mod:`workers.agent`): the pool posts its measurements for
a host in one call a poll and collects what finished in one call a poll
(:mod:`workers.mailbox`: ``enqueue`` and ``collect``).

A trial's GPU time, from the recorded measurement (landscapes hold medians, not wall times):
``WARMUP_S`` (the GPU worker's 25 ms warm-up) + 5 launches (3 for the warm-up's estimate, 2 checked
runs) x the median + repetitions x (median + ``FLUSH_S``, the L2 flush before each timed launch)
+ ``TRIAL_OVERHEAD_S`` (loading the module, the checks, reading the events). Repetitions: those
recorded, or ``workers.kernel_run.EARLY_REPS`` where the pool's early-stop bar is below the median.
A failed trial (screened, compile) takes no GPU time; one that failed on the GPU, the overhead.
On an H200 the worker alone measured 28-42 ms a trial for microsecond kernels (docs/BENCHMARKS.md,
"One GPU worker alone"); this model gives 27-36 ms on the shortest landscape.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from workers.mailbox import Outbox
from workers.replay import ReplayBench
from workers.results import Measurement

RESOURCE = "sim_gpu"  # Ray's custom resource: one per simulated GPU
GPUS_PER_HOST = 64  # simulated GPUs one actor process hosts
WARMUP_S = 0.025  # GpuBench.measure's warmup_ms
FLUSH_S = 17e-6  # an L2 flush of an H200 (docs/DESIGN.md, workers)
TRIAL_OVERHEAD_S = 1.2e-3  # the rest of a trial on an H200: 1.0-1.7 ms measured
EARLY_REPS = 5  # workers.kernel_run.EARLY_REPS (not imported: that module needs cuda-python)
_BEFORE_GPU = ("screened", "compile", "resources", "invalid")  # failures that never reach the GPU


def gpu_time(measurement: Measurement, abort_above_ms: float | None = None) -> tuple[float, float, float]:
    """(GPU seconds, kernel seconds, flush seconds) a real trial with this result would take."""
    timing = measurement.timing
    if measurement.failure in _BEFORE_GPU:
        return 0.0, 0.0, 0.0
    if timing is None or not measurement.ok:
        return TRIAL_OVERHEAD_S, 0.0, 0.0
    median = timing.median_ms / 1e3
    reps = int(timing.repetitions or 0)
    if abort_above_ms is not None and timing.median_ms > abort_above_ms:
        reps = min(reps, EARLY_REPS)
    kernel = WARMUP_S + (5 + reps) * median
    flush = reps * FLUSH_S
    return kernel + flush + TRIAL_OVERHEAD_S, kernel, flush


def simulated_resources(gpus: int | None) -> dict[str, float] | None:
    """Ray's custom resources for ``gpus`` simulated GPUs (None: none asked)."""
    return {RESOURCE: float(gpus)} if gpus else None


def host_counts(gpus: int, per_host: int = GPUS_PER_HOST) -> list[int]:
    """How many simulated GPUs each host actor holds: ``gpus`` spread evenly."""
    hosts = max(1, -(-gpus // per_host))
    return [gpus // hosts + (1 if i < gpus % hosts else 0) for i in range(hosts)]


class SimulatedGpus(Outbox):
    """An async Ray actor hosting ``count`` simulated GPUs of one landscape."""

    def __init__(self, landscape: str, family: Any, count: int) -> None:
        super().__init__()
        self._bench = ReplayBench(landscape, family)
        self._count = count
        self._locks: list[asyncio.Lock] | None = None  # made in the actor's event loop
        self._intervals: list[tuple[int, float, float]] = []
        self._late: list[float] = []  # how much later than asked each sleep ended (event loop busy)

    def device_info(self) -> Any:
        return self._bench.device_info()

    async def _measure(self, family: Any, problem: Any, gpu: int, params: Mapping[str, Any],
                       abort_above_ms: float | None) -> Measurement:
        """One trial on GPU ``gpu``: its GPU held for the trial's GPU time, then its recorded result."""
        if self._locks is None:
            self._locks = [asyncio.Lock() for _ in range(self._count)]
        recorded = self._bench.measure(None, None, family, problem, params=params)
        seconds, kernel, flush = gpu_time(recorded, abort_above_ms)
        async with self._locks[gpu]:
            start = time.monotonic()
            # until the GPU time has passed by this clock: an event loop's timers (uvloop's: a
            # cached clock, milliseconds) may wake a sleep early, and the next trial would start
            # inside this one's interval
            while (left := start + seconds - time.monotonic()) > 0:
                await asyncio.sleep(left)
            self._intervals.append((gpu, start, start + seconds))
            self._late.append(time.monotonic() - start - seconds)
        return replace(recorded, gpu_seconds=seconds, kernel_seconds=kernel, flush_seconds=flush)

    async def enqueue(self, family: Sequence[Any], _problem: Any,
                      letters: Sequence[tuple[int, int, int, bytes]]) -> None:
        """Measurements posted at once, as to a node agent (:class:`workers.agent.NodeAgent`):
        each (letter, gpu, generation, request: ``workers.request.pack``); each runs on its GPU
        in the order posted; ``collect`` hands their results over."""
        (ref,) = family
        loop = asyncio.get_running_loop()
        for letter, gpu, _generation, request in letters:
            _, _, problem, params, options = pickle.loads(request)
            loop.create_task(self._run_letter(letter, gpu, ref, problem, params, getattr(options.get("timing"), "abort_above_ms", None)))

    async def _run_letter(self, letter: int, gpu: int, family: Any, problem: Any,
                          params: Mapping[str, Any], abort: float | None) -> None:
        try:
            result = await self._measure(family, problem, gpu, params, abort)
        except Exception as exc:  # noqa: BLE001 - the trial fails, as a GPU actor's would
            result = Measurement.failed("worker", f"{type(exc).__name__}: {exc}"[:300])
        self._deliver(letter, result)

    def retime(self, kernels: Any, family_name: str, problem: Any, *, gpu: int, **options: Any) -> Any:
        """The recorded measurements (as a replay re-times); no GPU time is simulated for it."""
        return self._bench.retime(kernels, family_name, problem, **options)

    def intervals(self) -> list[tuple[int, float, float]]:
        """(gpu, start, end) of every measurement so far, in ``time.monotonic`` seconds (one
        clock for every process of the machine)."""
        return list(self._intervals)

    def lateness(self) -> list[float]:
        """Seconds each measurement's sleep overran its GPU time (a busy machine wakes it late;
        the GPU counts as idle meanwhile, so a late simulator lowers the busy shares)."""
        return list(self._late)

    def cpu_seconds(self) -> float:
        """This process's CPU time: what the simulation itself costs the machine."""
        return time.process_time()


class _Bound:
    def __init__(self, method: Any, gpu: int) -> None:
        self._method, self._gpu = method, gpu

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._method.remote(*args, gpu=self._gpu, **kwargs)


class SimulatedGpu:
    """One simulated GPU of a host actor, called as a GPU actor's handle is for what is not
    posted (``gpu.retime.remote(...)``, ``gpu.device_info.remote()``); ``host`` is the actor,
    ``index`` the GPU in it. Its measurements go through the pool's ``workers.mailbox.Mailbox``."""

    _PER_GPU = ("retime",)

    def __init__(self, host: Any, index: int) -> None:
        self.host, self.index = host, index

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.host, name)
        return _Bound(method, self.index) if name in self._PER_GPU else method


def busy_shares(intervals: list[tuple[int, float, float]], gpus: int, start: float, end: float) -> list[float]:
    """Each simulated GPU's busy share of the window [start, end]."""
    span = max(end - start, 1e-9)
    busy = [0.0] * gpus
    for gpu, a, b in intervals:
        overlap = min(b, end) - max(a, start)
        if overlap > 0 and gpu < gpus:
            busy[gpu] += overlap
    return [b / span for b in busy]


def steady_window(intervals: list[tuple[int, float, float]], gpus: int) -> tuple[float, float] | None:
    """The study's steady state: from the moment the last of the ``gpus`` started its first
    trial to the moment the first of them ended its last one (every GPU in play, the ramp-up
    and the tail left out); None when there is no such window (a GPU never measured, or the
    ramp-up overlaps the tail)."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for gpu, a, b in intervals:
        first[gpu] = min(first.get(gpu, a), a)
        last[gpu] = max(last.get(gpu, b), b)
    if len(first) < gpus:
        return None
    start, end = max(first.values()), min(last.values())
    return (start, end) if end > start else None
