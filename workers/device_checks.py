"""Checks of a run's buffers on the GPU, so that nothing the size of an output is read back::

    checks = DeviceChecks(bench)                     # its kernels compiled once, cached on disk
    checks.begin()
    bad = checks.nonfinite(ptr, nbytes, "fp16")      # each queued on the bench's stream
    differ = checks.unequal(first, second, nbytes)
    total = checks.checksum(ptr, nbytes)
    counts = checks.collect()                        # one synchronize: counts[bad], counts[differ]

A profile of an 8x16x2048x128 trial spent 29 ms scanning a 64 MB output for NaN on the host and
11 ms comparing two runs' outputs, after reading both back; these kernels read it at the
memory's speed. The kernels read 16-byte vectors: buffers are allocated in whole vectors
(``padded``) and the padding holds zeros.
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Protocol

from templates.family import FLOAT_FORMATS
from workers.driver import check_call, driver_api
from workers.compile import compile_cubin, default_cache_dir
from workers.pinned import PinnedBuffers
from workers.results import Binary, CompileRequest, DeviceInfo

VECTOR = 16  # bytes each thread reads at a time (uint4)
SLOTS = 64  # counters per begin/collect
THREADS = 256

SOURCE = r"""
typedef unsigned long long u64;

// Sum a thread's count over its warp, then into the total (the block size is a multiple of 32).
__device__ __forceinline__ void add_total(u64 local, u64* total) {
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(total, local);
}

// Elements of a 32-bit word whose exponent bits are all set (NaN, Inf, the poison).
__device__ __forceinline__ u64 nonfinite_in(unsigned w, unsigned mask, int halves) {
  if (halves) return ((w & mask) == mask) + (((w >> 16) & mask) == mask);
  return (w & mask) == mask;
}

extern "C" __global__ void count_nonfinite(const uint4* x, u64 n, unsigned mask, int halves, u64* total) {
  u64 local = 0;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    uint4 v = x[i];
    local += nonfinite_in(v.x, mask, halves) + nonfinite_in(v.y, mask, halves)
           + nonfinite_in(v.z, mask, halves) + nonfinite_in(v.w, mask, halves);
  }
  add_total(local, total);
}

// 32-bit words that differ between a and b.
extern "C" __global__ void count_unequal(const uint4* a, const uint4* b, u64 n, u64* total) {
  u64 local = 0;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    uint4 u = a[i], v = b[i];
    local += (u.x != v.x) + (u.y != v.y) + (u.z != v.z) + (u.w != v.w);
  }
  add_total(local, total);
}

// Sum of every 32-bit word times an odd weight (2j + 1 for word j), modulo 2^64: any one changed
// word changes it.
extern "C" __global__ void checksum(const uint4* x, u64 n, u64* total) {
  u64 local = 0;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    uint4 v = x[i];
    u64 w = 8 * i + 1;
    local += v.x * w + v.y * (w + 2) + v.z * (w + 4) + v.w * (w + 6);
  }
  add_total(local, total);
}
"""


def compile_checks(compute_capability: tuple[int, int], cache_dir: Any = None) -> Binary:
    """The check kernels' cubin for a GPU of ``compute_capability`` (from the disk cache once
    compiled: a GpuBench starts this on a thread when it starts)."""
    major, minor = compute_capability
    return compile_cubin(CompileRequest(SOURCE, "count_nonfinite", ("-O3",), f"sm_{major}{minor}"),
                         cache_dir=cache_dir or default_cache_dir())


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to whole vectors (at least one)."""
    return max(VECTOR, -(-nbytes // VECTOR) * VECTOR)


def pack_params(values: list[Any]) -> Any:
    """kernelParams as C wants it: a void*[] whose entries point at each ctypes value (keep
    ``values`` alive while the array is used)."""
    return (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])


def pack_args(step: Any, pointers: Mapping[str, int]) -> tuple[Any, list[Any]]:
    """A launch step's arguments (``templates.family.Launch``) over device ``pointers`` (buffer
    name -> address), as kernelParams and the values it points at (keep them alive while it is
    used): buffers as addresses, tensor maps encoded over their buffer, i32 and f32 scalars.
    Raises ValueError for a buffer the pointers do not have."""
    values: list[Any] = []
    for arg in step.args:
        if arg.kind == "buffer":
            if arg.value not in pointers:
                raise ValueError(f"launch names an unknown buffer {arg.value!r}")
            values.append(ctypes.c_uint64(int(pointers[arg.value])))
        elif arg.kind == "i32":
            values.append(ctypes.c_int32(int(arg.value)))
        elif arg.kind == "tensormap":  # encoded over its buffer; kept alive in ``values``
            from workers.tensormap import encode

            if arg.value.buffer not in pointers:
                raise ValueError(f"tensor map over an unknown buffer {arg.value.buffer!r}")
            values.append(encode(arg.value, int(pointers[arg.value.buffer])))
        else:  # f32
            values.append(ctypes.c_float(float(arg.value)))
    return pack_params(values), values


class ChecksBench(Protocol):
    """What DeviceChecks uses of its bench (a ``workers.gpu.GpuBench``): the stream it queues
    on, the page-locked host memory the counts come back to, and the device."""

    stream: Any
    pinned: PinnedBuffers

    def device_info(self) -> DeviceInfo: ...


class DeviceChecks:
    def __init__(self, bench: ChecksBench, cache_dir: Any = None) -> None:
        self._d, self._check, self._bench = driver_api(), check_call, bench
        binary = compile_checks(bench.device_info().compute_capability, cache_dir)
        d, check = self._d, self._check
        self._module = check("cuModuleLoadData", d.cuModuleLoadData(binary.cubin))
        self._functions = {name: check("cuModuleGetFunction", d.cuModuleGetFunction(self._module, name.encode()))
                           for name in ("count_nonfinite", "count_unequal", "checksum")}
        self._counters = check("cuMemAlloc", d.cuMemAlloc(8 * SLOTS))
        self._host = bench.pinned.array(("checks",), (SLOTS,), "uint64")
        self._blocks = 8 * bench.device_info().sm_count
        self._used = 0
        self._keep: list[Any] = []

    def begin(self) -> None:
        """Zero the counters (queued) for a new set of checks."""
        self._check("cuMemsetD32Async", self._d.cuMemsetD32Async(
            self._counters, 0, 2 * SLOTS, self._bench.stream))
        self._used = 0
        self._keep.clear()

    def nonfinite(self, ptr: Any, nbytes: int, element: str) -> int:
        """Queue a count of NaN/Inf/poison elements in ``element`` format; returns its slot."""
        size, mask = FLOAT_FORMATS[element]
        return self._queue("count_nonfinite", ptr, nbytes,
                           [ctypes.c_uint32(mask), ctypes.c_int32(1 if size == 2 else 0)])

    def unequal(self, first: Any, second: Any, nbytes: int) -> int:
        """Queue a count of the 4-byte words that differ between two buffers; returns its slot."""
        return self._queue("count_unequal", first, nbytes, [], second)

    def checksum(self, ptr: Any, nbytes: int) -> int:
        """Queue a checksum of a buffer's words; returns its slot."""
        return self._queue("checksum", ptr, nbytes, [])

    def _queue(self, name: str, ptr: Any, nbytes: int, extra: list[Any], second: Any = None) -> int:
        if self._used == SLOTS:
            raise ValueError(f"more than {SLOTS} device checks between begin() and collect()")
        slot, vectors = self._used, padded(nbytes) // VECTOR
        counter = ctypes.c_uint64(int(self._counters) + 8 * slot)
        values = [ctypes.c_uint64(int(ptr))]
        if second is not None:
            values.append(ctypes.c_uint64(int(second)))
        values += [ctypes.c_uint64(vectors), *extra, counter]
        params = pack_params(values)
        self._keep += [values, params]  # alive until the launch has read them (collect)
        blocks = max(1, min(-(-vectors // THREADS), self._blocks))
        self._check("cuLaunchKernel", self._d.cuLaunchKernel(
            self._functions[name], blocks, 1, 1, THREADS, 1, 1, 0, self._bench.stream,
            ctypes.addressof(params), 0))
        self._used += 1
        return slot

    def collect(self) -> list[int]:
        """Wait for the queued checks; their counts, by slot."""
        d, check, stream = self._d, self._check, self._bench.stream
        if self._used:
            check("cuMemcpyDtoHAsync", d.cuMemcpyDtoHAsync(
                self._host.ctypes.data, self._counters, 8 * self._used, stream))
        check("cuStreamSynchronize", d.cuStreamSynchronize(stream))
        counts = [int(c) for c in self._host[:self._used]]
        self._keep.clear()
        return counts

    def close(self) -> None:
        self._d.cuMemFree(self._counters)
        self._d.cuModuleUnload(self._module)
