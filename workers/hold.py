"""A stream held by a spin kernel while the host queues the work it times (nvbench's "blocking
kernel"), so that every timed region holds GPU work only; and the L2 flush queued before each
timed repetition::

    hold = StreamHold(stream, (9, 0))     # its kernels compiled once (disk cache), loaded here
    with hold:                            # the spin kernel is queued; leaving the block releases it
        for i in range(HOLD_BATCH):
            hold.flush(buffer, nbytes); record(start); launch(); record(stop)
    synchronize(); hold.timeouts          # holds that gave up waiting (the host was that late)

Without it, CUDA events around a launch also time the host: when the GPU has finished the L2
flush before the host has queued the launch, it idles between the start event and the kernel,
and the idle time is counted as the kernel's. torch SDPA's dispatch takes longer than the 17 us
flush: on an H200, SDPA flash on 2x8x512x64 fp16 timed 35.8 us that way and 18.0 us held
(docs/scripts/timing_methods.py). Behind a hold, the GPU finds the
flush, the start event, the launch and the end event queued back to back.

At most HOLD_BATCH repetitions go behind one hold: a launch queue that fills up would block
the host before it releases the stream. The spin kernel gives up after TIMEOUT_NS whatever
happens (``timeouts`` counts it), so a host that blocks cannot hang the GPU.

The flush *reads* a buffer of the L2's size or more, so that the timed kernel starts with an L2
of clean lines that are not its own. A memset of the L2's size (nvbench's flush, and this
project's until 2026-11-27; Triton's ``do_bench`` zeroes 256 MB) leaves it full of dirty lines,
and the timed kernel pays for writing them back as its reads evict them: on an H100, cuBLAS's
16x4096x4096 bf16 GEMM timed 24.4 us after a memset and 19.1 us after a read, while a
compute-bound 8192x4096x4096 moved by 1.5% (docs/BENCHMARKS.md, "Timing methods"). The
write-back is not the kernel's cost, and it flattened the ratios of memory-bound kernels
towards 1.
"""

from __future__ import annotations

import ctypes
from typing import Any

from workers.compile import compile_cubin, default_cache_dir
from workers.device_checks import pack_params
from workers.driver import check_call, driver_api
from workers.results import Binary, CompileRequest

HOLD_BATCH = 32  # repetitions (flush, 2 events, launch) queued behind one hold
TIMEOUT_NS = 1_000_000_000  # the longest the spin kernel waits for its release
KERNEL = "hold_stream"
FLUSH_KERNEL = "flush_read"
FLUSH_GRID = (1024, 256)  # blocks, threads: a grid-stride read of the buffer

SOURCE = r"""
// Spin until the host writes a generation >= ours into `release` (host memory mapped into the
// device), or until timeout_ns have passed; count the time-outs in `timeouts`.
extern "C" __global__ void hold_stream(const volatile unsigned* release, unsigned generation,
                                       unsigned long long timeout_ns, unsigned* timeouts) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*release < generation) {
    asm volatile("nanosleep.u32 200;");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) {
      atomicAdd(timeouts, 1u);
      return;
    }
  }
}

// Read n 16-byte words: the lines they fill in the L2 are clean. The words' XOR is written to
// `sink` only if it equals `never` (the host passes a value it cannot be), so that the loads stay.
extern "C" __global__ void flush_read(const uint4* x, unsigned long long n, unsigned never, unsigned* sink) {
  unsigned v = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const uint4 w = x[i];
    v ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (v == never) *sink = v;
}
"""


def compile_hold(compute_capability: tuple[int, int], cache_dir: Any = None) -> Binary:
    """The spin and flush kernels' cubin (from the disk cache once compiled)."""
    major, minor = compute_capability
    return compile_cubin(CompileRequest(SOURCE, KERNEL, ("-O3",), f"sm_{major}{minor}"),
                         cache_dir=cache_dir or default_cache_dir())


def stream_handle(stream: Any) -> Any:
    """A CUstream for ``stream``: a CUstream already, or a raw handle (torch's ``cuda_stream``)."""
    driver = driver_api()
    return stream if isinstance(stream, driver.CUstream) else driver.CUstream(int(stream))


class StreamHold:
    """Holds one stream of the current context; use ``with hold:`` around each batch."""

    def __init__(self, stream: Any, compute_capability: tuple[int, int], cache_dir: Any = None) -> None:
        d = self._d = driver_api()
        self.stream = stream_handle(stream)
        binary = compile_hold(compute_capability, cache_dir)
        self._module = check_call("cuModuleLoadData", d.cuModuleLoadData(binary.cubin))
        self._function = check_call("cuModuleGetFunction", d.cuModuleGetFunction(self._module, KERNEL.encode()))
        self._flush = check_call("cuModuleGetFunction", d.cuModuleGetFunction(self._module, FLUSH_KERNEL.encode()))
        self._host = int(check_call("cuMemHostAlloc", d.cuMemHostAlloc(16, d.CU_MEMHOSTALLOC_DEVICEMAP)))
        self._device = int(check_call("cuMemHostGetDevicePointer", d.cuMemHostGetDevicePointer(self._host, 0)))
        self._release = ctypes.c_uint32.from_address(self._host)  # word 0: the generation released
        self._timeouts = ctypes.c_uint32.from_address(self._host + 4)  # word 1: time-outs so far
        self._release.value = self._timeouts.value = 0
        self._generation = 0
        self.held = False

    @property
    def timeouts(self) -> int:
        """Holds that ended by time-out rather than release (read after a synchronize)."""
        return int(self._timeouts.value)

    def __enter__(self) -> "StreamHold":
        if self.held:
            raise RuntimeError("the stream is held already")
        self._generation += 1
        values = [ctypes.c_uint64(self._device), ctypes.c_uint32(self._generation),
                  ctypes.c_uint64(TIMEOUT_NS), ctypes.c_uint64(self._device + 4)]
        params = pack_params(values)
        check_call("cuLaunchKernel", self._d.cuLaunchKernel(
            self._function, 1, 1, 1, 1, 1, 1, 0, self.stream, ctypes.addressof(params), 0))
        self.held = True
        return self

    def flush(self, buffer: Any, nbytes: int) -> None:
        """Queue on the stream a read of the ``nbytes`` at ``buffer`` (a device buffer of zeros, the
        L2's size or more, in whole 16-byte words): the L2 then holds its clean lines only."""
        values = [ctypes.c_uint64(int(buffer)), ctypes.c_uint64(nbytes // 16), ctypes.c_uint32(1),
                  ctypes.c_uint64(self._device + 8)]  # XOR of zeros: never 1; word 2 is the sink
        params = pack_params(values)
        blocks, threads = FLUSH_GRID
        check_call("cuLaunchKernel", self._d.cuLaunchKernel(
            self._flush, blocks, 1, 1, threads, 1, 1, 0, self.stream, ctypes.addressof(params), 0))

    def __exit__(self, *exc: Any) -> None:
        """Release the stream (also when the block raised: nothing may stay held)."""
        self._release.value = self._generation
        self.held = False

    def close(self) -> None:
        """Free the flag and the module (after the stream's work has completed)."""
        self._d.cuMemFreeHost(self._host)
        self._d.cuModuleUnload(self._module)
