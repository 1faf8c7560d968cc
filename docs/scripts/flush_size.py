"""How large must the L2 flush be? Times kernels after memsets of 0, 0.5, 1, 1.5, 2 and 4 times
the L2's size, in one process on one GPU, and prints each size's median and GPU time a repetition.

    PYTHONPATH=<checkout> python3 docs/scripts/flush_size.py 2,8,512,64 bf16 0 4,16,4096,128 fp16 1

nvbench flushes with a memset of the L2's size; Triton's do_bench with 256 MB; the workers
used twice the L2. A size is large enough when the medians stop rising past it. For each
problem: the family's first three starting points, compiled here, verified, warmed up,
then 5 rounds in which every size takes a block of 100 repetitions (sizes alternate, so drift
in clocks or temperature falls on all of them). One JSON line per config.
"""
import json
import statistics
import sys

from templates import get_family
from workers.driver import check_call, driver_api
from workers.gpu import GpuBench
from workers.kernel_run import verified_run

ROUNDS, REPS = 5, 100
FACTORS = (0.0, 0.5, 1.0, 1.5, 2.0, 4.0)


def run_block(trial, buffer, nbytes):
    """REPS timed launches, each after a memset of ``nbytes`` (none when 0); their times (ms)."""
    d, stream = driver_api(), trial.bench.stream
    pairs = []
    for i in range(REPS):
        if nbytes:
            check_call("cuMemsetD32Async", d.cuMemsetD32Async(buffer, i, nbytes // 4, stream))
        pairs.append(trial._timed_run("first"))
    check_call("cuStreamSynchronize", d.cuStreamSynchronize(stream))
    return trial.elapsed(pairs)


def main(argv):
    family = get_family("attention")
    bench = GpuBench()
    d = driver_api()
    l2 = bench._attribute("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE")
    buffer = check_call("cuMemAlloc", d.cuMemAlloc(int(max(FACTORS) * l2)))
    info = bench.device_info()
    print(json.dumps({"gpu": info.name, "l2_bytes": l2}), flush=True)
    limits = info.limits
    for shape, dtype, causal in zip(argv[0::3], argv[1::3], argv[2::3]):
        problem = family.parse_problem(shape, dtype, {"causal": causal == "1"})
        for params in family.starting_points(problem, limits)[:3]:
            trial = verified_run(bench, family, problem, params)
            trial.warm_up(25.0)
            times = {f: [] for f in FACTORS}
            span = {f: 0.0 for f in FACTORS}
            for _ in range(ROUNDS):
                for factor in FACTORS:
                    nbytes = int(factor * l2) // 4 * 4
                    begin, end = trial._event(), trial._event()
                    check_call("cuEventRecord", d.cuEventRecord(begin, bench.stream))
                    times[factor] += run_block(trial, buffer, nbytes)
                    check_call("cuEventRecord", d.cuEventRecord(end, bench.stream))
                    check_call("cuEventSynchronize", d.cuEventSynchronize(end))
                    span[factor] += float(check_call("cuEventElapsedTime", d.cuEventElapsedTime(begin, end)))
            changed = bench.residents.changed()
            print("FLUSH " + json.dumps({
                "problem": problem.key, "params": params, "inputs_changed": changed,
                "median_us": {str(f): round(1e3 * statistics.median(times[f]), 3) for f in FACTORS},
                "gpu_us_per_rep": {str(f): round(1e3 * span[f] / (ROUNDS * REPS), 2) for f in FACTORS}}),
                flush=True)
            trial.release()
    check_call("cuMemFree", d.cuMemFree(buffer))
    bench.close()


if __name__ == "__main__":
    main(sys.argv[1:])
