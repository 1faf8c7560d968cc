"""Studies from scratch on one problem: when did each find its winner, and how good was it?

    python3 docs/scripts/study_from_scratch.py 4,16,4096,128 fp16 100 sqlite:///$OUT/scratch [--causal]

Two studies of the same number of trials, each on a fresh database (the URL plus "-starts.db" and
"-tpe.db": no other problem tuned, so no warm start from neighbours): one led by the family's starting points (what `tuner tune` does),
one by the sampler alone (warm_start=0: TPE from its random start-up trials). For each: the
best-so-far after every tenth trial, the trial that first measured the stored winner's config,
and the winner (after the study's interleaved re-timing of its top trials).
"""

from __future__ import annotations

import logging
import sys

import tuner
from templates import get_family

FAMILY = get_family("attention")


def report(label: str, result, db: str, problem) -> None:
    trials = tuner.show(result.study, db=db).trials
    best = result.best
    found = next((t.number for t in trials if t.params == best.params), None) if best else None
    curve, running = [], None
    for index, trial in enumerate(sorted(trials, key=lambda t: t.number), start=1):
        if trial.status == "ok" and trial.median_ms and (running is None or trial.median_ms < running):
            running = trial.median_ms
        if index % 10 == 0 or index == len(trials):
            curve.append(f"{index}: {FAMILY.tflops(problem, running):.0f}" if running else f"{index}: -")
    ok = sum(t.status == "ok" for t in trials)
    print(f"{label}: {len(trials)} trials ({ok} ok, {result.invalid} refused by the constraints), "
          f"{result.elapsed_s:.0f} s", flush=True)
    print(f"  best so far (TFLOPS) after trial: {', '.join(curve)}", flush=True)
    if best:
        print(f"  winner {FAMILY.tflops(problem, best.median_ms):.0f} TFLOPS ({best.median_ms * 1e3:.1f} us), "
              f"first measured at trial {found}: {best.params}", flush=True)


def main(shape: str, dtype: str, trials: int, db: str, causal: bool) -> None:
    logging.basicConfig(level=logging.WARNING)
    problem = FAMILY.parse_problem(shape, dtype, {"causal": causal})
    led = tuner.tune("attention", shape, dtype, {"causal": causal}, trials=trials, db=f"{db}-starts.db", seed=0)
    report("starting points first", led, f"{db}-starts.db", problem)
    alone = tuner.tune("attention", shape, dtype, {"causal": causal}, trials=trials, db=f"{db}-tpe.db", seed=0, warm_start=0)
    report("the sampler alone (warm_start=0)", alone, f"{db}-tpe.db", problem)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], "--causal" in sys.argv[5:])
