"""One trial's CUDA state on a GpuBench: the module, the buffers, the launch and the timing.

``Trial.run`` raises LaunchError with ``Trial.stage`` telling where; GpuBench classifies it.
``Trial.release`` frees everything the trial took (called unless the context is dead).
Its steps (``load``, ``upload``, ``verify``, ``warm_up``, ``timed_launch``) also serve the
interleaved re-timing (``workers.retime``), where several trials share one set of buffers.
"""

from __future__ import annotations

import ctypes
import math
import statistics
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from templates.family import BufferSpec, KernelFamily, Launch, Problem, Validation
from workers.results import Binary, Measurement

if TYPE_CHECKING:
    from workers.gpu import GpuBench

_DEFAULT_DYNAMIC_SMEM = 48 * 1024
EARLY_REPS = 5  # repetitions that decide whether a candidate is clearly behind the best


class Trial:
    def __init__(self, bench: "GpuBench", binary: Binary, launch: Launch,
                 buffers: dict[str, tuple[Any, int]] | None = None) -> None:
        """``buffers``: another trial's, to launch on them (this trial then never frees them)."""
        from workers.gpu import check_call, driver_api

        self._d = driver_api()
        self._check = check_call
        self.bench = bench
        self.binary = binary
        self.launch = launch
        self.stage = "load"
        self.module: Any = None
        self.function: Any = None
        self._owns_buffers = buffers is None
        self.buffers: dict[str, tuple[Any, int]] = {} if buffers is None else buffers  # name -> (CUdeviceptr, bytes)
        self.events: list[Any] = []
        self._param_values: list[Any] = []  # keeps the ctypes values alive during launches
        self._param_array: Any = None
        self.stopped_early = False  # the timing ended after EARLY_REPS: clearly behind the best
        self.kernel_ms = 0.0  # the GPU's time in this trial's timed and warm-up launches

    # -- steps --------------------------------------------------------------------------------
    def run(self, family: KernelFamily, problem: Problem, *, seed: int, warmup_ms: float,
            rep: int | None, min_reps: int, max_reps: int, target_ms: float,
            flush_l2: bool, abort_above_ms: float | None = None) -> Measurement:
        failure = self.load()
        if failure is not None:
            return failure
        inputs, specs = self.upload(family, problem, seed)
        first = self.run_once(specs)
        validation = family.validate(problem, inputs, first)
        if not validation.ok:
            return wrong(validation)
        second = self.run_once(specs, readback=1)
        for name, array in first.items():
            if not same_bits(array, second[name]):
                differ = int(np.count_nonzero(array.view(np.uint8) != second[name].view(np.uint8)))
                return Measurement.failed(
                    "nondeterministic", f"two runs differ in {differ} bytes of {name!r}",
                    error=validation.error, max_abs_error=validation.max_abs_error)
        self.stage = "timing"
        samples = self._time(warmup_ms, rep, min_reps, max_reps, target_ms, flush_l2, abort_above_ms)
        from workers.gpu import timing_of

        detail = (f"timing stopped early: median of {EARLY_REPS} repetitions above "
                  f"{abort_above_ms:.4g} ms" if self.stopped_early else "")
        return Measurement(ok=True, timing=timing_of(samples), detail=detail, error=validation.error,
                           max_abs_error=validation.max_abs_error)

    def load(self) -> Measurement | None:
        """Load the module and find the kernel; a failure when it needs more shared memory than
        the device has, else None."""
        d, check = self._d, self._check
        check("cuCtxSetCurrent", d.cuCtxSetCurrent(self.bench.context))
        self.stage = "load"
        self.module = check("cuModuleLoadData", d.cuModuleLoadData(self.binary.cubin))
        self.stage = "function"
        self.function = check("cuModuleGetFunction",
                              d.cuModuleGetFunction(self.module, self.launch.kernel.encode()))
        self.stage = "smem"
        return self._raise_smem_limit()

    def upload(self, family: KernelFamily, problem: Problem,
               seed: int) -> tuple[dict[str, np.ndarray], tuple[BufferSpec, ...]]:
        """Allocate the inputs (copied from the host) and the outputs; returns both."""
        d, check = self._d, self._check
        self.stage = "alloc"
        inputs = self.bench.host_inputs(family, problem, seed)
        specs = tuple(family.outputs(problem))
        for name, array in inputs.items():
            ptr = self._alloc(name, array.nbytes)
            self.stage = "copy"
            check("cuMemcpyHtoD", d.cuMemcpyHtoD(ptr, array.ctypes.data, array.nbytes))
            self.stage = "alloc"
        for spec in specs:
            self._alloc(spec.name, int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize)
        self.build_params()
        return inputs, specs

    def verify(self, family: KernelFamily, problem: Problem, inputs: Mapping[str, np.ndarray],
               specs: Sequence[BufferSpec]) -> Validation:
        """One run on poisoned outputs, checked against the reference."""
        return family.validate(problem, inputs, self.run_once(specs))

    def _raise_smem_limit(self) -> Measurement | None:
        d, check = self._d, self._check
        attrs = d.CUfunction_attribute
        static = int(check("cuFuncGetAttribute",
                           d.cuFuncGetAttribute(attrs.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.function)))
        limit = self.bench.device_info().max_smem_per_block_optin
        dynamic = self.launch.smem_bytes
        if static + dynamic > limit:
            return Measurement.failed(
                "resources", f"needs {static + dynamic} bytes of shared memory per block "
                f"({static} static + {dynamic} dynamic), the device allows {limit}")
        if dynamic > _DEFAULT_DYNAMIC_SMEM:
            check("cuFuncSetAttribute", d.cuFuncSetAttribute(
                self.function, attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic))
        return None

    def _alloc(self, name: str, nbytes: int) -> Any:
        if name in self.buffers:
            raise ValueError(f"buffer {name!r} is both an input and an output")
        ptr = self._check("cuMemAlloc", self._d.cuMemAlloc(max(nbytes, 1)))
        self.buffers[name] = (ptr, nbytes)
        return ptr

    def build_params(self) -> None:
        """kernelParams as C wants it: a void*[] whose entries point at each argument's value."""
        values: list[Any] = []
        for arg in self.launch.args:
            if arg.kind == "buffer":
                if arg.value not in self.buffers:
                    raise ValueError(f"launch names an unknown buffer {arg.value!r}")
                values.append(ctypes.c_uint64(int(self.buffers[arg.value][0])))
            elif arg.kind == "i32":
                values.append(ctypes.c_int32(int(arg.value)))
            else:  # f32
                values.append(ctypes.c_float(float(arg.value)))
        self._param_values = values
        self._param_array = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.addressof(v) for v in values])

    def _launch(self) -> None:
        launch, d = self.launch, self._d
        self.stage = "launch"
        self._check("cuLaunchKernel", d.cuLaunchKernel(
            self.function, *launch.grid, *launch.block, launch.smem_bytes, self.bench.stream,
            ctypes.addressof(self._param_array), 0))

    def _poison(self, specs) -> None:
        self.stage = "poison"
        for spec in specs:
            ptr, nbytes = self.buffers[spec.name]
            self._check("cuMemsetD16", self._d.cuMemsetD16(ptr, int(spec.poison) & 0xFFFF, nbytes // 2))

    def run_once(self, specs: Sequence[BufferSpec], readback: int = 0) -> dict[str, np.ndarray]:
        """Poison the outputs, launch once, read them back into the bench's page-locked
        ``readback`` buffers (valid until the next run with the same ``readback``)."""
        d, check = self._d, self._check
        self._poison(specs)
        self._launch()
        self.stage = "synchronize"
        check("cuStreamSynchronize", d.cuStreamSynchronize(self.bench.stream))
        self.stage = "readback"
        outputs = {}
        for spec in specs:
            ptr, nbytes = self.buffers[spec.name]
            host = self.bench.pinned.array(("readback", spec.name, readback), tuple(spec.shape), spec.dtype)
            check("cuMemcpyDtoH", d.cuMemcpyDtoH(host.ctypes.data, ptr, nbytes))
            outputs[spec.name] = host
        return outputs

    def _event(self) -> Any:
        event = self._check("cuEventCreate", self._d.cuEventCreate(0))
        self.events.append(event)
        return event

    def warm_up(self, warmup_ms: float) -> float:
        """Time 3 launches for an estimate, then launch for about ``warmup_ms``; returns the
        estimated milliseconds of one launch."""
        d, check, stream = self._d, self._check, self.bench.stream
        begin, end = self._event(), self._event()
        check("cuEventRecord", d.cuEventRecord(begin, stream))
        for _ in range(3):
            self._launch()
        check("cuEventRecord", d.cuEventRecord(end, stream))
        self.stage = "timing"
        check("cuEventSynchronize", d.cuEventSynchronize(end))
        estimate = max(check("cuEventElapsedTime", d.cuEventElapsedTime(begin, end)) / 3, 1e-3)
        launches = min(max(1, math.ceil(warmup_ms / estimate)), 10_000)
        for _ in range(launches):
            self._launch()
        self.kernel_ms += (3 + launches) * estimate
        return estimate

    def _time(self, warmup_ms: float, rep: int | None, min_reps: int, max_reps: int,
              target_ms: float, flush_l2: bool, abort_above_ms: float | None = None) -> list[float]:
        """Warm up, then time ``count`` repetitions; with ``abort_above_ms``, the first
        EARLY_REPS decide: a median above it ends the timing there (clearly behind the best)."""
        estimate = self.warm_up(warmup_ms)
        count = rep if rep is not None else min(max(math.ceil(target_ms / estimate), min_reps), max_reps)
        if abort_above_ms is None or count <= EARLY_REPS:
            return self._repeat(count, flush_l2, 0)
        first = self._repeat(EARLY_REPS, flush_l2, 0)
        if statistics.median(first) > abort_above_ms:
            self.stopped_early = True
            return first
        return first + self._repeat(count - EARLY_REPS, flush_l2, EARLY_REPS)

    def _repeat(self, count: int, flush_l2: bool, offset: int) -> list[float]:
        """``count`` timed launches, one after another, then their times."""
        pairs = [self.timed_launch(i, flush_l2) for i in range(offset, offset + count)]
        self.stage = "timing"
        self._check("cuStreamSynchronize", self._d.cuStreamSynchronize(self.bench.stream))
        return self.elapsed(pairs)

    def timed_launch(self, index: int, flush_l2: bool) -> tuple[Any, Any]:
        """Queue one timed repetition: the L2 flushed first (the flush buffer is filled with
        ``index``), then the kernel between two events; returns the events (read them after a
        synchronize, with :meth:`elapsed`)."""
        d, check, stream = self._d, self._check, self.bench.stream
        start, stop = self._event(), self._event()
        if flush_l2:
            self.stage = "flush"
            self.bench.flush_l2(index)
        check("cuEventRecord", d.cuEventRecord(start, stream))
        self._launch()
        check("cuEventRecord", d.cuEventRecord(stop, stream))
        return start, stop

    def elapsed(self, pairs: Sequence[tuple[Any, Any]]) -> list[float]:
        """Milliseconds between each (start, stop) pair of events that have completed."""
        d, check = self._d, self._check
        self.stage = "timing"
        times = [float(check("cuEventElapsedTime", d.cuEventElapsedTime(a, b))) for a, b in pairs]
        self.kernel_ms += sum(times)
        return times

    # -- cleanup ------------------------------------------------------------------------------
    def release(self) -> None:
        d, check = self._d, self._check
        for event in self.events:
            check("cuEventDestroy", d.cuEventDestroy(event))
        self.events.clear()
        if self._owns_buffers:
            for ptr, _ in self.buffers.values():
                check("cuMemFree", d.cuMemFree(ptr))
            self.buffers.clear()
        if self.module is not None:
            check("cuModuleUnload", d.cuModuleUnload(self.module))
            self.module = None


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bytes (NaN payloads and signed zeros included), compared
    in 8-byte words where they divide evenly, without copying either."""
    if a.nbytes != b.nbytes:
        return False
    x, y = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    if x.size % 8 == 0:
        x, y = x.view(np.uint64), y.view(np.uint64)
    return bool(np.array_equal(x, y))


def wrong(validation: Validation) -> Measurement:
    """The failure of an output that does not match the reference."""
    return Measurement.failed("wrong", validation.reason or "output does not match the reference",
                              error=validation.error, max_abs_error=validation.max_abs_error)
