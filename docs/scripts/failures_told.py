"""How the sampler should be told a measured config that failed: ``inf`` (what a study does) or
Optuna's FAIL (what the optuna-dashboard copy shows), on the recorded landscapes.

    python3 docs/scripts/failures_told.py tests/data/attention_*.json templates/attention/landscapes/*.json --seeds 20

TPE learns only from COMPLETE (and PRUNED) trials: a FAIL is invisible to it, and so is a
``constraints_func`` verdict on one (Optuna computes constraints only for COMPLETE and PRUNED
trials). Prints, per way of telling, the median and p90 of measured trials to come within 2% and
5% of each landscape's best (TPE told the family's constraints, as ``tune`` runs it).
"""

from __future__ import annotations

import argparse
import statistics

import optuna

from tuner.reports.bench_search import _quantile, load, run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("landscapes", nargs="+")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lands = [load(path) for path in args.landscapes]
    print(f"{len(lands)} landscapes, {args.seeds} seeds; failed configs per landscape: "
          + ", ".join(str(sum(v == float('inf') for v in land.values.values())) for land in lands))
    print("| failures told as | runs | median 2% | p90 2% | median 5% | p90 5% |")
    print("|---|---|---|---|---|---|")
    for label, as_fail in (("inf (COMPLETE)", False), ("FAIL", True)):
        two, five = [], []
        for land in lands:
            for seed in range(args.seeds):
                f, t, _, _ = run(land, "optuna-tpe", seed, 1, failed_as_fail=as_fail)
                five.append(f)
                two.append(t)
        print(f"| {label} | {len(two)} | {statistics.median(two):g} | {_quantile(two, 0.9):g} | "
              f"{statistics.median(five):g} | {_quantile(five, 0.9):g} |")


if __name__ == "__main__":
    main()
