"""Tune the attention suite in a chosen order inside one Ray session, within a time budget.

    python3 docs/scripts/tune_suite.py fp16,bf16 20 sqlite:///$OUT/suite.db 415 ["4,16,4096,128;..."]

Longest problems first, so that the warm start of the shorter ones can draw on their winners.
Then `python3 -m tuner bench attention --db ...` times the stored winners beside SDPA.
"""

import logging
import sys
import time

import tuner
from workers.ray_session import shared_ray

ORDER = ("4,16,4096,128", "1,32,8192,128", "8,16,2048,128", "1,16,4097,128",
         "16,16,2048,64", "2,16,1000,64", "2,8,512,64", "1,8,512,64")


def main(dtypes: str, trials: int, db: str, budget: float, shapes: str | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    order = shapes.split(";") if shapes else ORDER
    start = time.time()
    with shared_ray():
        for dtype in dtypes.split(","):
            for shape in order:
                for causal in (False, True):
                    left = budget - (time.time() - start)
                    if left < 10:
                        print("budget spent before", shape, dtype, causal, flush=True)
                        continue
                    r = tuner.tune("attention", shape, dtype, {"causal": causal}, trials=trials, db=db, seed=0,
                                   time_budget=left)
                    best = r.best
                    print(f"TUNED {shape} {dtype} causal={causal}: {r.status} measured={r.measured} "
                          f"failed={r.failed} busy={r.gpu_busy_s:.0f}s/{r.elapsed_s:.0f}s "
                          f"best={best.median_ms * 1e3 if best else 0:.1f} us {best.params if best else None} "
                          f"[{time.time() - start:.0f} s]", flush=True)
    print(f"tuning done in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), *sys.argv[5:6])
