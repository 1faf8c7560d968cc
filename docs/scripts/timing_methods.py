"""Three ways of timing the same kernels, in one process on one GPU: the events as `tuner bench`
placed them before 2026-11-23 (flush, start event, call, end event, then a synchronize, per
repetition), the same behind holds of the stream (the method every timing uses now), and
``triton.testing.do_bench`` (median). For our kernel (a family starting point) and SDPA's flash
and cuDNN backends.

    python3 docs/scripts/timing_methods.py "1,8,512,64;2,8,512,64;16,16,2048,64;4,16,4096,128" fp16
"""

from __future__ import annotations

import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from templates import get_family
from workers.driver import check_call, driver_api
from workers.gpu import GpuBench, l2_flush_bytes
from workers.hold import stream_handle
from workers.peers import held_timer, do_bench_ms
from workers.kernel_run import repeat_in_turns, verified_run

REPS = 200
FAMILY = get_family("attention")


def unheld_torch(run, flush, reps=REPS):
    """The old peer timing: per repetition a flush, events around the call, a synchronize."""
    samples = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def ours(bench, problem):
    params = FAMILY.starting_points(problem, bench.device_info().limits)[0]
    trial = verified_run(bench, FAMILY, problem, params)
    trial.warm_up(25.0)
    unheld = [trial.timed_launch(True) for _ in range(REPS)]
    check_call("cuStreamSynchronize", driver_api().cuStreamSynchronize(bench.stream))
    old = statistics.median(trial.elapsed(unheld))
    held = statistics.median(repeat_in_turns([trial], REPS, True)[0])
    stream = stream_handle(torch.cuda.current_stream().cuda_stream)
    second = do_bench_ms(lambda: trial.launch_on(stream))
    torch.cuda.synchronize()
    trial.release()
    return old, held, second


def main(shapes: str, dtype: str) -> None:
    bench = GpuBench(0)
    timer = held_timer(torch)
    flush = torch.empty(l2_flush_bytes(torch.cuda.get_device_properties(0).L2_cache_size),
                        dtype=torch.int8, device="cuda")
    rows = []
    for shape in shapes.split(";"):
        problem = FAMILY.parse_problem(shape, dtype, {"causal": False})
        times = {"ours": ours(bench, problem)}
        host = FAMILY.inputs(problem, 0)
        tdtype = torch.float16 if dtype == "fp16" else torch.bfloat16
        q, k, v = (torch.from_numpy(host[n].view(np.int16)).view(tdtype).cuda() for n in ("q", "k", "v"))
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(backend):
                def run():
                    return F.scaled_dot_product_attention(q, k, v)
                for _ in range(10):
                    run()
                old = unheld_torch(run, flush)
                held = statistics.median(timer.time(run, REPS)[0])
                times[name] = (old, held, do_bench_ms(run))
        for name, (old, held, second) in times.items():
            rows.append((problem.key, name, old, held, second))
        for name in ("flash", "cudnn"):
            o, p = times["ours"], times[name]
            print(f"RATIO {problem.key} {name}/ours: old {p[0] / o[0]:.2f}x  held {p[1] / o[1]:.2f}x  "
                  f"do_bench {p[2] / o[2]:.2f}x", flush=True)
    print("| problem | kernel | old events (us) | held (us) | do_bench (us) | held / do_bench |")
    print("|---|---|---|---|---|---|")
    for key, name, old, held, second in rows:
        print(f"| {key} | {name} | {1e3 * old:.1f} | {1e3 * held:.1f} | {1e3 * second:.1f} | {held / second:.3f} |")
    timer.hold.close()
    bench.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
