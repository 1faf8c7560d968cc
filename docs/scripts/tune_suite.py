"""Tune a family's benchmark suite inside one Ray session, within a time budget.

    python3 docs/scripts/tune_suite.py fp16,bf16 20 sqlite:///$OUT/suite.db 415 ["4,16,4096,128;..."]
    python3 docs/scripts/tune_suite.py fp16,bf16 20 sqlite:///$OUT/gemm.db 415 --family gemm

The suite's problems of the given dtypes (or only those of the given shapes), largest FLOP count
first, so that the warm start of the smaller ones can draw on their winners. Then
`python3 -m tuner bench FAMILY --db ...` times the stored winners beside the peers.
"""

import argparse
import logging
import time

import tuner
from templates import get_family
from workers.ray_session import shared_ray


def main(family: str, dtypes: str, trials: int, db: str, budget: float, shapes: str | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fam = get_family(family)
    wanted = {tuple(int(x) for x in s.split(",")) for s in shapes.split(";")} if shapes else None
    problems = [fam.parse_problem(shape, dtype, flags) for shape, dtype, flags in fam.suite
                if dtype in dtypes.split(",") and (wanted is None or tuple(shape) in wanted)]
    problems.sort(key=lambda p: (dtypes.split(",").index(p.dtype), -fam.flops(p)))
    start = time.time()
    with shared_ray():
        for problem in problems:
            left = budget - (time.time() - start)
            if left < 10:
                print("budget spent before", problem.key, flush=True)
                continue
            r = tuner.tune(family, problem.shape, problem.dtype, dict(problem.flags), trials=trials, db=db, seed=0,
                           time_budget=left)
            best = r.best
            print(f"TUNED {problem.key}: {r.status} measured={r.measured} "
                  f"failed={r.failed} busy={r.gpu_busy_s:.0f}s/{r.elapsed_s:.0f}s "
                  f"best={best.median_ms * 1e3 if best else 0:.1f} us {best.params if best else None} "
                  f"[{time.time() - start:.0f} s]", flush=True)
    print(f"tuning done in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtypes")
    parser.add_argument("trials", type=int)
    parser.add_argument("db")
    parser.add_argument("budget", type=float)
    parser.add_argument("shapes", nargs="?")
    parser.add_argument("--family", default="attention")
    a = parser.parse_args()
    main(a.family, a.dtypes, a.trials, a.db, a.budget, a.shapes)
