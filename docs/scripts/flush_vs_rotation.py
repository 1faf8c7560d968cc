"""Two ways to time a kernel with a cold L2, side by side on one GPU: the flush the workers use
(a memset of the L2's size before each repetition) and rotation (each repetition reads its own
copy of the inputs and writes its own outputs, enough copies that the last use of a copy is at
least twice the L2 ago). Rotation spends no GPU time on a flush; the question is whether it
gives the same medians.

    PYTHONPATH=<checkout> python3 docs/scripts/flush_vs_rotation.py 2,8,512,64 bf16 0 4,16,4096,128 fp16 1

For each problem: the family's starting points, compiled here, verified, warmed up, then
5 blocks of 100 repetitions with each method, alternating; one JSON line per config with both
medians (of all 500 repetitions), their ratio, and the GPU time a repetition took with each.
"""
import json
import math
import statistics
import sys

from templates import get_family
from workers.driver import check_call, driver_api
from workers.gpu import GpuBench
from workers.kernel_run import verified_run

BLOCKS, REPS = 5, 100


def copies_for(bench, resident, l2_bytes):
    """Extra sets of (inputs copied from the resident ones, outputs) for rotation."""
    d = driver_api()
    set_bytes = sum(n for _, n in resident.buffers.values())
    count = max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)
    sets = []
    for _ in range(count):
        buffers = {}
        for name, (ptr, nbytes) in resident.buffers.items():
            new = check_call("cuMemAlloc", d.cuMemAlloc(nbytes))
            if name in resident.inputs:
                check_call("cuMemcpyDtoD", d.cuMemcpyDtoD(new, ptr, nbytes))
            buffers[name] = (new, nbytes)
        sets.append(buffers)
    return sets


def run_block(trial, copies, flush):
    """REPS timed launches, each after a flush or on the next copy; their times (ms)."""
    pairs = []
    for i in range(REPS):
        if flush:
            trial.bench.flush_l2()
        pairs.append(trial._timed_run("first" if flush else f"copy{i % copies}"))
    check_call("cuStreamSynchronize", driver_api().cuStreamSynchronize(trial.bench.stream))
    return trial.elapsed(pairs)


def main(argv):
    family = get_family("attention")
    bench = GpuBench()
    l2 = bench._attribute("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE")
    d = driver_api()
    info = bench.device_info()
    limits = info.limits
    for shape, dtype, causal in zip(argv[0::3], argv[1::3], argv[2::3]):
        problem = family.parse_problem(shape, dtype, {"causal": causal == "1"})
        for params in family.starting_points(problem, limits)[:3]:
            trial = verified_run(bench, family, problem, params)
            sets = copies_for(bench, trial.resident, l2)
            for i, buffers in enumerate(sets):  # launch arguments on each copy, as KernelRun keeps them
                trial._params[f"copy{i}"] = trial._pack({**trial.resident.buffers, **buffers})
            trial.warm_up(25.0)
            by = {"flush": [], "rotation": []}
            span = {"flush": 0.0, "rotation": 0.0}
            for _ in range(BLOCKS):
                for method in ("flush", "rotation"):
                    begin, end = trial._event(), trial._event()
                    check_call("cuEventRecord", d.cuEventRecord(begin, bench.stream))
                    times = run_block(trial, len(sets), method == "flush")
                    check_call("cuEventRecord", d.cuEventRecord(end, bench.stream))
                    check_call("cuEventSynchronize", d.cuEventSynchronize(end))
                    span[method] += float(check_call("cuEventElapsedTime", d.cuEventElapsedTime(begin, end)))
                    by[method] += times
            changed = bench.residents.changed()
            flush, rotation = statistics.median(by["flush"]), statistics.median(by["rotation"])
            print("ROTATION " + json.dumps({
                "problem": problem.key, "params": params, "copies": len(sets),
                "median_flush_ms": round(flush, 5), "median_rotation_ms": round(rotation, 5),
                "rotation_over_flush": round(rotation / flush, 4),
                "gpu_ms_per_rep_flush": round(span["flush"] / (BLOCKS * REPS), 5),
                "gpu_ms_per_rep_rotation": round(span["rotation"] / (BLOCKS * REPS), 5),
                "inputs_changed": changed}), flush=True)
            for s in sets:
                for ptr, _ in s.values():
                    check_call("cuMemFree", d.cuMemFree(ptr))
            trial.release()
    bench.close()


if __name__ == "__main__":
    main(sys.argv[1:])
