"""The time each fault costs a study, on a GPU: the fault family (docs/examples/faults) tuned to its
17 starting points (each fault once, between healthy configs), then the table of what each fault
cost, per FAULT value and per failure kind: trials, wall seconds from submission to the failed
result, workers replaced, seconds until the replacement was ready, their sum.

    PYTHONPATH=<checkout> python3 docs/scripts/fault_table.py [DB_URL] [--measure-timeout 10] [--cpus 1]

``--cpus 1`` (the default) starts Ray with one CPU, so the configs compile one at a time and reach
the GPU in the order asked; ``--cpus 0`` lets ``tune`` start Ray as the command does (all CPUs).
Prints each trial (its fault, kind and reason), the two tables, and one JSON line ``FAULTS {...}``.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import tuner
from tuner.study.faults import fault_rows, fault_table

FAULTS = str(Path(__file__).resolve().parents[1] / "examples" / "faults")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="?", help="database URL (default: a new SQLite file)")
    parser.add_argument("--shape", default="1048576")
    parser.add_argument("--measure-timeout", type=float, default=10.0)
    parser.add_argument("--cpus", type=int, default=1, help="Ray's CPUs (0: let tune start Ray)")
    args = parser.parse_args()
    db = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'faults.db'}"
    if args.cpus:
        import ray

        ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="WARNING")
    start = time.monotonic()
    result = tuner.tune(FAULTS, args.shape, "fp32", trials=17, db=db, retime=0, seed=0,
                        measure_timeout_s=args.measure_timeout)
    seconds = time.monotonic() - start
    detail = tuner.show(result.study, db=db)
    print(f"study {result.study}: {result.status}, {result.measured} trials ({result.failed} failed) "
          f"in {seconds:.1f} s, measure timeout {args.measure_timeout:g} s")
    for trial in sorted(detail.trials, key=lambda t: t.created_at):
        outcome = f"{trial.median_ms:.4f} ms" if trial.status == "ok" else f"{trial.failure}: {trial.reason}"
        print(f"  #{trial.number:<3} {trial.params['FAULT']:<14} {outcome}")
    print()
    print("\n".join(fault_table(fault_rows(result.faults, key=lambda c: c.params["FAULT"]), label="FAULT")))
    print()
    print("\n".join(fault_table(fault_rows(result.faults), label="failure kind")))
    print("FAULTS " + json.dumps({"seconds": round(seconds, 2), "measure_timeout_s": args.measure_timeout,
                                  "faults": [{"fault": c.params["FAULT"], "failure": c.failure,
                                              "wall_s": round(c.wall_s, 3), "replaced": c.replaced,
                                              "replace_s": round(c.replace_s, 3)} for c in result.faults]}))


if __name__ == "__main__":
    main()
