"""Where a GPU worker's time goes: ``GpuBench.measure`` under cProfile, without Ray.

    python3 docs/scripts/profile_measure.py 8,16,2048,128 fp16 0 24

Compiles N random valid configs (in parallel processes), measures the first in full, then
measures every one with the early-stop bar at 1.5x that median (as a study does), once plain
(a trial's wall time against its kernels' and L2 flushes' GPU time, CUDA events) and once under
cProfile (the GPU worker's time, the kernels' and the costliest calls).
"""

import cProfile
import io
import pstats
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from templates import get_family
from workers.compile import compile_cubin
from workers.gpu import GpuBench
from workers.results import CompileRequest
from workers.timing_options import TimingOptions

FAMILY = get_family("attention")


def _compile(args):
    params, problem = args
    request = CompileRequest(FAMILY.render(params, problem), "attention_fwd",
                             FAMILY.compile_options(params, problem))
    return compile_cubin(request)


def main(shape: str, dtype: str, causal: str, count: int) -> None:
    problem = FAMILY.parse_problem(shape, dtype, {"causal": causal == "1"})
    bench = GpuBench(0)
    info = bench.device_info()
    limits = info.limits
    configs = random.Random(0).sample(FAMILY.valid_configs(problem, limits), count)
    with ProcessPoolExecutor(16) as pool:
        binaries = list(pool.map(_compile, [(c, problem) for c in configs]))
    kernels = [(b, FAMILY.launch(c, problem)) for b, c in zip(binaries, configs)]
    first = bench.measure(*kernels[0], "attention", problem)
    bar = 1.5 * first.timing.median_ms
    start = time.perf_counter()  # a pass without the profiler: what the GPU did of the wall time
    plain = [bench.measure(b, launch, "attention", problem, timing=TimingOptions(abort_above_ms=bar)) for b, launch in kernels]
    wall = time.perf_counter() - start
    kernel, flush = sum(m.kernel_seconds for m in plain), sum(m.flush_seconds for m in plain)
    print(f"PLAIN {shape} {dtype} causal={causal}: {count} trials, {wall / count * 1e3:.2f} ms a trial: "
          f"kernels {kernel / count * 1e3:.2f} ms, L2 flushes {flush / count * 1e3:.2f} ms, "
          f"the rest {(wall - kernel - flush) / count * 1e3:.2f} ms")
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    results = [bench.measure(b, launch, "attention", problem, timing=TimingOptions(abort_above_ms=bar)) for b, launch in kernels]
    profile.disable()
    wall = time.perf_counter() - start
    gpu = sum(m.gpu_seconds for m in results)
    kernel = sum(m.kernel_seconds for m in results)
    early = sum("stopped early" in m.detail for m in results)
    print(f"PROFILE {shape} {dtype} causal={causal}: {count} trials in {wall:.2f} s, "
          f"{wall / count * 1e3:.0f} ms a trial; kernels {kernel / wall:.0%} of it; "
          f"{early} stopped early; ok {sum(m.ok for m in results)}; gpu_seconds {gpu:.2f}")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
    print(out.getvalue()[-4500:])
    bench.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
