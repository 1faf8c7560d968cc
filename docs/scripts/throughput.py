"""Studies run one after another in one Ray session; one JSON line of throughput figures each.

    PYTHONPATH=<checkout> python3 docs/scripts/throughput.py LABEL DB "SHAPE DTYPE CAUSAL TRIALS" ...
    e.g. throughput.py new sqlite:///$OUT/new.db "2,8,1024,64 fp16 1 100" "4,16,4096,128 fp16 1 60"

Run it with another checkout on PYTHONPATH to compare versions of the tuner on one GPU.
``gpu_busy`` is the GPU workers' time measuring over the study's wall time; ``kernels`` the
part the kernels themselves ran (CUDA events; absent in versions that did not count it; before
commit 6d0c451 the warm-up's share was an estimate that overcounted microsecond kernels);
``flushes`` the part the GPU spent flushing the L2 before timed launches (0 before it was counted).
"""

import json
import logging
import sys
import time

import tuner
from workers.ray_session import shared_ray


def main(label: str, db: str, studies: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    with shared_ray():
        for study in studies:
            shape, dtype, causal, trials = study.split()
            start = time.time()
            r = tuner.tune("attention", shape, dtype, {"causal": causal == "1"}, trials=int(trials), db=db, seed=0)
            kernels = getattr(r, "kernel_busy_s", None)
            print("THROUGHPUT " + json.dumps({
                "label": label, "problem": f"{shape} {dtype} causal={causal}", "measured": r.measured,
                "reused": r.reused, "invalid": r.invalid, "elapsed_s": round(r.elapsed_s, 1),
                "call_s": round(time.time() - start, 1),
                "trials_per_min": round(60 * r.measured / r.elapsed_s, 1),
                "gpu_busy": round(r.gpu_busy_s / r.elapsed_s, 3),
                "kernels": None if kernels is None else round(kernels / r.elapsed_s, 3),
                "flushes": round(getattr(r, "flush_busy_s", 0.0) / r.elapsed_s, 3),
                "best_us": round(r.best.median_ms * 1e3, 2) if r.best else None}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
