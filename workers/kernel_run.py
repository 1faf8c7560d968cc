"""One kernel's run on a GpuBench: its module, its launch, the checks and the timing (a trial's
measurement is one run; a re-timing, several interleaved; a paired timing, two).

``KernelRun.run`` raises LaunchError with ``KernelRun.stage`` telling where; GpuBench classifies it.
``KernelRun.release`` frees what the trial took (called unless the context is dead); the buffers
are the bench's (``workers.resident``), kept for the next trial of the same problem.
Its steps (``load``, ``attach``, ``verify``, ``warm_up``, ``timed_launch``) also serve the
interleaved re-timing (``workers.retime``).
"""

from __future__ import annotations

import ctypes
import math
import statistics
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Protocol, Sequence

from templates.family import KernelFamily, Launch, Problem, Validation, unwritten
from workers.device_checks import DeviceChecks, pack_args
from workers.driver import check_call, driver_api
from workers.hold import HOLD_BATCH, StreamHold
from workers.paired import anchor_loaded, paired_of
from workers.resident import Resident, ResidentBuffers
from workers.results import Binary, DeviceInfo, Measurement, timing_of
from workers.timing_options import TimingOptions

_DEFAULT_DYNAMIC_SMEM = 48 * 1024
EARLY_REPS = 5  # repetitions that decide whether a candidate is clearly behind the best


class RunBench(Protocol):
    """What a KernelRun uses of its bench (a ``workers.gpu.GpuBench``): its context and stream, the
    resident buffers, the checks, the hold and the L2 flush, and the events it times with. A bench
    may also have ``clocks_now()``, read around the timed repetitions when it does."""

    context: Any
    stream: Any
    last_event: Any  # the latest event a live trial recorded after a launch
    residents: ResidentBuffers

    def device_info(self) -> DeviceInfo: ...

    def resident(self, family: KernelFamily, problem: Problem, seed: int) -> Resident: ...

    @property
    def checks(self) -> DeviceChecks: ...

    @property
    def hold(self) -> StreamHold: ...

    def event(self) -> Any: ...

    def spare(self, events: Sequence[Any]) -> None: ...

    def flush_l2(self) -> None: ...


class KernelRun:
    def __init__(self, bench: RunBench, binary: Binary, launch: Launch) -> None:
        self._d = driver_api()
        self._check = check_call
        self.bench = bench
        self.binary = binary
        self.launch = launch
        self.stage = "load"
        self.module: Any = None
        self.functions: list[Any] = []  # one for each of the launch's kernels, in order
        self.resident: Resident | None = None  # the bench's buffers, once attached
        self.events: list[Any] = []
        self._workspace: dict[str, tuple[Any, int]] = {}  # the launch's own buffers: name -> (ptr, bytes)
        self._params: dict[str, list[Any]] = {}  # "first"/"second" -> (kernelParams, values) per kernel
        self.stopped_early = False  # the timing ended after EARLY_REPS: clearly behind the best
        self.kernel_ms = 0.0  # the GPU's time in this trial's checked, warm-up and timed launches
        self.flush_ms = 0.0  # the GPU's time before its timed launches: the L2 flushes (and any gap)
        self._flushes: list[tuple[Any, Any]] = []  # (the stream's previous event, a timed start)
        self._warming: tuple[Any, Any] | None = None  # the warm-up's events, until elapsed() reads them
        self.late_batches = 0  # holds of the stream that timed out before the host released them
        # the GPU's clocks, temperature and power right before and right after the timed
        # repetitions: {"before": {...}, "after": {...}} (set by the timing)
        self.clocks: dict[str, Any] = {}

    # -- steps --------------------------------------------------------------------------------
    def run(self, family: KernelFamily, problem: Problem, *, seed: int, timing: TimingOptions,
            beside: KernelRun | None = None) -> Measurement:
        """Load, verify and time this kernel; ``beside`` (the study's anchor): loaded too and
        timed in turns with it, its ratios to it in the measurement's ``paired``
        (``workers.paired``; an anchor that cannot be loaded leaves this one timed alone)."""
        failure = self.load()
        if failure is not None:
            return failure
        self.attach(family, problem, seed)
        failure, validation = self.verify(family, problem)
        if failure is None:
            self.stage = "timing"
            runs = [self]
            if beside is not None and anchor_loaded(beside):
                beside.attach(family, problem, seed)
                runs.append(beside)
            samples = time_in_turns(runs, timing)
        self.stage = "check"  # after any run, failed or not: the next trial needs intact inputs
        changed = self.bench.residents.changed()
        if changed is not None:
            return Measurement.failed("wrong", f"the kernel wrote into its input {changed!r}")
        if failure is not None:
            return failure

        detail = (f"timing stopped early: median of {EARLY_REPS} repetitions above "
                  f"{timing.abort_above_ms:.4g} ms" if self.stopped_early else "")
        if self.late_batches:
            detail = "; ".join(filter(None, [detail, late_note(self.late_batches)]))
        return Measurement(ok=True, timing=timing_of(samples[0]), detail=detail, error=validation.error,
                           max_abs_error=validation.max_abs_error,
                           paired=paired_of(*samples) if len(samples) == 2 else None)

    @property
    def function(self) -> Any:
        """The first kernel's function."""
        return self.functions[0] if self.functions else None

    def load(self) -> Measurement | None:
        """Load the module and find its kernels; a failure when one needs more shared memory than
        the device has, else None."""
        d, check = self._d, self._check
        check("cuCtxSetCurrent", d.cuCtxSetCurrent(self.bench.context))
        self.stage = "load"
        self.module = check("cuModuleLoadData", d.cuModuleLoadData(self.binary.cubin))
        self.stage = "function"
        self.functions = [check("cuModuleGetFunction", d.cuModuleGetFunction(self.module, step.kernel.encode()))
                          for step in self.launch.kernels]
        self.stage = "smem"
        for function, step in zip(self.functions, self.launch.kernels):
            failure = self._raise_smem_limit(function, step)
            if failure is not None:
                return failure
        return None

    def attach(self, family: KernelFamily, problem: Problem, seed: int) -> None:
        """Launch on the bench's buffers for (problem, seed), uploaded when they are new."""
        self.stage = "alloc"
        self.resident = self.bench.resident(family, problem, seed)
        self._allocate_workspace()
        first = {**self.resident.buffers, **self._workspace}
        second = {**first, **self.resident.second}
        # timed runs write where the first did
        self._params = {"first": [self._pack(step, first) for step in self.launch.kernels],
                        "second": [self._pack(step, second) for step in self.launch.kernels]}

    def verify(self, family: KernelFamily, problem: Problem) -> tuple[Measurement | None, Validation | None]:
        """Two runs on poisoned outputs, the second into a second set of them. On the GPU: the
        NaN, Inf and unwritten elements of the first are counted, and the two runs compared
        word by word; then the family's reference comparison reads back what it checks.
        Returns (the failure, None) or (None, the validation)."""
        resident, checks = self.resident, self.bench.checks
        assert resident is not None, "attach() first"
        runs = []
        for which, buffers in (("first", resident.buffers), ("second", resident.second)):
            self._poison(buffers)
            runs.append(self._timed_run(which))
        self.stage = "check"
        checks.begin()
        slots = []
        for spec in resident.specs:
            (first, nbytes), (second, _) = resident.buffers[spec.name], resident.second[spec.name]
            bad = checks.nonfinite(first, nbytes, spec.element) if spec.element else None
            slots.append((spec.name, bad, checks.unequal(first, second, nbytes)))
        self.stage = "synchronize"
        counts = checks.collect()
        self.elapsed(runs)  # the two runs count as the kernel's time on the GPU, as timed ones do
        for name, bad, _ in slots:
            if bad is not None and counts[bad]:
                return wrong(unwritten(name, counts[bad])), None
        self.stage = "readback"
        validation = family.validate(problem, resident.inputs, resident.views(), resident.reference)
        if not validation.ok:
            return wrong(validation), None
        for name, _, differ in slots:
            if counts[differ]:
                return Measurement.failed(
                    "nondeterministic", f"two runs differ in {counts[differ]} 4-byte words of {name!r}",
                    error=validation.error, max_abs_error=validation.max_abs_error), None
        return None, validation

    def _raise_smem_limit(self, function: Any, step: Launch) -> Measurement | None:
        d, check = self._d, self._check
        attrs = d.CUfunction_attribute
        static = int(check("cuFuncGetAttribute",
                           d.cuFuncGetAttribute(attrs.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function)))
        limit = self.bench.device_info().max_smem_per_block_optin
        dynamic = step.smem_bytes
        if static + dynamic > limit:
            return Measurement.failed(
                "resources", f"{step.kernel} needs {static + dynamic} bytes of shared memory per block "
                f"({static} static + {dynamic} dynamic), the device allows {limit}")
        if dynamic > _DEFAULT_DYNAMIC_SMEM:
            check("cuFuncSetAttribute", d.cuFuncSetAttribute(
                function, attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic))
        return None

    def _allocate_workspace(self) -> None:
        """The launch's workspace buffers (the trial's own: freed by release)."""
        taken = set(self.resident.buffers) if self.resident is not None else set()
        for name, nbytes in self.launch.workspace:
            if name in taken or name in self._workspace:
                raise ValueError(f"workspace {name!r} has the name of another buffer")
            ptr = self._check("cuMemAlloc", self._d.cuMemAlloc(int(nbytes)))
            self._workspace[name] = (ptr, int(nbytes))
            self._check("cuMemsetD8", self._d.cuMemsetD8(ptr, 0, int(nbytes)))  # zero once, as documented

    def _pack(self, step: Launch, buffers: Mapping[str, tuple[Any, int]]) -> tuple[Any, list[Any]]:
        """``step``'s arguments on ``buffers``, as kernelParams (and the values it points at)."""
        return pack_args(step, {name: int(ptr) for name, (ptr, _) in buffers.items()})

    def _launch(self, which: str = "first", stream: Any = None) -> None:
        """Queue the launch's kernels, in order, on ``stream`` (the bench's by default)."""
        d = self._d
        self.stage = "launch"
        stream = self.bench.stream if stream is None else stream
        capped = any(step.blocks_per_sm_cap for step in self.launch.kernels)
        sm_count = self.bench.device_info().sm_count if capped else 0
        for function, step, (params, _) in zip(self.functions, self.launch.kernels, self._params[which]):
            self._check("cuLaunchKernel", d.cuLaunchKernel(
                function, *step.grid_on(sm_count), *step.block, step.smem_bytes, stream, ctypes.addressof(params), 0))

    def launch_on(self, stream: Any) -> None:
        """Queue one launch on ``stream`` (a CUstream of the bench's context, e.g. torch's), on the
        verified buffers: for timing the same kernel another way (``triton.testing.do_bench``)."""
        self._launch("first", stream)

    def _poison(self, buffers: Mapping[str, tuple[Any, int]]) -> None:
        """Fill the outputs among ``buffers`` with their poison (queued on the stream)."""
        self.stage = "poison"
        assert self.resident is not None
        for spec in self.resident.specs:
            ptr, nbytes = buffers[spec.name]
            self._check("cuMemsetD16Async", self._d.cuMemsetD16Async(
                ptr, int(spec.poison) & 0xFFFF, nbytes // 2, self.bench.stream))

    def _timed_run(self, which: str) -> tuple[Any, Any]:
        """Queue one launch on the ``which`` arguments between two events."""
        d, check, stream = self._d, self._check, self.bench.stream
        start, stop = self._event(), self._event()
        check("cuEventRecord", d.cuEventRecord(start, stream))
        self._launch(which)
        check("cuEventRecord", d.cuEventRecord(stop, stream))
        self.bench.last_event = stop
        return start, stop

    def _event(self) -> Any:
        event = self.bench.event()
        self.events.append(event)
        return event

    def warm_up(self, warmup_ms: float) -> float:
        """Time 3 launches for an estimate, then launch for about ``warmup_ms``; returns the
        estimated milliseconds of one launch. The warm-up launches run between two events that
        the next :meth:`elapsed` reads (after a synchronize): their GPU time is measured, not
        taken as launches x estimate, which the first three launches' cold start inflated
        (a study of 11 us kernels counted more kernel time than its worker's wall time)."""
        d, check, stream = self._d, self._check, self.bench.stream
        begin, end = self._event(), self._event()
        check("cuEventRecord", d.cuEventRecord(begin, stream))
        for _ in range(3):
            self._launch()
        check("cuEventRecord", d.cuEventRecord(end, stream))
        self.stage = "timing"
        check("cuEventSynchronize", d.cuEventSynchronize(end))
        three = float(check("cuEventElapsedTime", d.cuEventElapsedTime(begin, end)))
        estimate = max(three / 3, 1e-3)
        launches = min(max(1, math.ceil(warmup_ms / estimate)), 10_000)
        start, stop = self._event(), self._event()
        check("cuEventRecord", d.cuEventRecord(start, stream))
        for _ in range(launches):
            self._launch()
        check("cuEventRecord", d.cuEventRecord(stop, stream))
        self.bench.last_event = stop
        self.kernel_ms += three
        self._warming = (start, stop)
        return estimate

    def _read_clocks(self) -> dict[str, Any]:
        """The bench's GPU clocks, temperature and power now (NVML: microseconds), or {}."""
        read = getattr(self.bench, "clocks_now", None)
        return dict(read()) if read is not None else {}

    @contextmanager
    def held(self) -> Iterator[None]:
        """Queue behind a hold of the bench's stream (``workers.hold``): the GPU starts on what
        the block queued only when it ends, so no host time falls between a start event and
        its launch. An event recorded after the hold starts the count of the first flush."""
        with self.bench.hold:
            mark = self._event()
            self._check("cuEventRecord", self._d.cuEventRecord(mark, self.bench.stream))
            self.bench.last_event = mark
            yield

    def timed_launch(self, flush_l2: bool) -> tuple[Any, Any]:
        """Queue one timed repetition: the L2 flushed first (``GpuBench.flush_l2``), then the
        kernel between two events; returns the events (read them after a synchronize, with
        :meth:`elapsed`). The GPU's time from the stream's previous timed or
        warm-up launch to this one's start is the flush's (and any wait for this launch): it
        needs no events of its own, :meth:`elapsed` counts it in ``flush_ms``."""
        before = self.bench.last_event
        if flush_l2:
            self.stage = "flush"
            self.bench.flush_l2()
        pair = self._timed_run("first")
        if flush_l2 and before is not None:
            self._flushes.append((before, pair[0]))
        return pair

    def elapsed(self, pairs: Sequence[tuple[Any, Any]]) -> list[float]:
        """Milliseconds between each (start, stop) pair of events that have completed."""
        d, check = self._d, self._check
        self.stage = "timing"
        times = [float(check("cuEventElapsedTime", d.cuEventElapsedTime(a, b))) for a, b in pairs]
        self.kernel_ms += sum(times)
        self.flush_ms += sum(float(check("cuEventElapsedTime", d.cuEventElapsedTime(a, b)))
                             for a, b in self._flushes)  # they precede the pairs: complete too
        self._flushes.clear()
        if self._warming is not None:  # the warm-up ran before these, so it has completed too
            self.kernel_ms += float(check("cuEventElapsedTime", d.cuEventElapsedTime(*self._warming)))
            self._warming = None
        return times

    # -- cleanup ------------------------------------------------------------------------------
    def release(self) -> None:
        """Give the events back to the bench and free the module (the buffers are the bench's)."""
        d, check = self._d, self._check
        self._flushes.clear()
        self.bench.spare(self.events)
        self.events.clear()
        if self.module is not None:
            check("cuModuleUnload", d.cuModuleUnload(self.module))
            self.module = None
        for ptr, _ in self._workspace.values():
            check("cuMemFree", d.cuMemFree(ptr))
        self._workspace.clear()


def time_in_turns(runs: Sequence[KernelRun], timing: TimingOptions) -> list[list[float]]:
    """Warm ``runs`` up (``warmup_ms`` shared among them), then time them in turns, each once a
    round, in order: each one's times. Rounds: ``rep``, or as many as take about ``target_ms``
    in all, at least ``min_reps``, at most ``max_reps`` (of several: as many launches in all as
    one alone would make, and never fewer than ``min_reps`` rounds). With ``abort_above_ms`` the
    first EARLY_REPS rounds decide: the first run's median above it ends the timing there
    (clearly behind the best). The first run keeps the clocks read around the timed rounds."""
    first = runs[0]
    estimate = sum(run.warm_up(timing.warmup_ms / len(runs)) for run in runs)
    most = timing.max_reps if len(runs) == 1 else max(timing.min_reps, timing.max_reps // len(runs))
    count = timing.rep if timing.rep is not None else min(
        max(math.ceil(timing.target_ms / estimate), timing.min_reps), most)
    before = first._read_clocks()  # the warm-up runs on the GPU now: its clocks under load
    abort = timing.abort_above_ms
    if abort is None or count <= EARLY_REPS:
        samples = repeat_in_turns(runs, count, timing.flush_l2)
    else:
        samples = repeat_in_turns(runs, EARLY_REPS, timing.flush_l2)
        if statistics.median(samples[0]) > abort:
            first.stopped_early = True
        else:
            rest = repeat_in_turns(runs, count - EARLY_REPS, timing.flush_l2)
            samples = [done + more for done, more in zip(samples, rest)]
    first.clocks = {"before": before, "after": first._read_clocks()}  # the stream is synchronized
    return samples


def repeat_in_turns(runs: Sequence[KernelRun], count: int, flush_l2: bool) -> list[list[float]]:
    """``count`` rounds of timed launches, each run once a round in order, queued behind holds of
    the stream (HOLD_BATCH launches a hold), then each run's times; holds that timed out are
    counted on the first run."""
    first = runs[0]
    pairs: list[list[tuple[Any, Any]]] = [[] for _ in runs]
    late = first.bench.hold.timeouts
    per_hold = max(1, HOLD_BATCH // len(runs))
    for start in range(0, count, per_hold):
        with first.held():
            for _ in range(start, min(count, start + per_hold)):
                for run, timed in zip(runs, pairs):
                    timed.append(run.timed_launch(flush_l2))
    first.stage = "timing"
    check_call("cuStreamSynchronize", driver_api().cuStreamSynchronize(first.bench.stream))
    first.late_batches += first.bench.hold.timeouts - late
    return [run.elapsed(timed) for run, timed in zip(runs, pairs)]


def verified_run(bench: RunBench, family: KernelFamily, problem: Problem, params: Mapping[str, Any],
                   *, seed: int = 0) -> KernelRun:
    """``params`` compiled in this process, loaded on ``bench`` and verified on its buffers of
    (problem, seed): a trial to warm up and time by hand (scripts and GPU tests that compare ways
    of timing). Raises ValueError when it fails; release it when done."""
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    launch = family.launch(params, problem)
    binary = compile_cubin(CompileRequest(family.render(params, problem), launch.kernel,
                                          tuple(family.compile_options(params, problem))))
    try:
        return verified(bench, binary, launch, family, problem, seed=seed)
    except ValueError as exc:
        raise ValueError(f"{dict(params)}: {exc}") from None


def verified(bench: RunBench, binary: Binary, launch: Launch, family: KernelFamily, problem: Problem,
             *, seed: int = 0) -> KernelRun:
    """``binary`` loaded on ``bench`` and verified on its buffers of (problem, seed), as a trial
    verifies it. Raises ValueError (the failure and its reason) when it fails, having released
    what it took; release the trial when done."""
    trial = KernelRun(bench, binary, launch)
    failure = trial.load()
    if failure is None:
        trial.attach(family, problem, seed)
        failure, _ = trial.verify(family, problem)
    if failure is not None:
        trial.release()
        raise ValueError(f"{failure.failure}: {failure.reason}")
    return trial


def late_note(batches: int) -> str:
    """What a measurement says when some of its holds timed out: those batches' times may hold
    host time (the host queued them slower than the hold's time-out)."""
    return (f"{batches} batch{'es' if batches != 1 else ''} of repetitions started before the host "
            f"had queued them (the stream's hold timed out): their times may include host time")


def wrong(validation: Validation) -> Measurement:
    """The failure of an output that does not match the reference."""
    return Measurement.failed("wrong", validation.reason or "output does not match the reference",
                              error=validation.error, max_abs_error=validation.max_abs_error)
