"""Stored values against a side-by-side re-timing: does a two-GPU study's normalization hold?

    PYTHONPATH=<checkout> python3 docs/scripts/drift_check.py [--shape 2,32,4096,128] [--dtype bf16]
        [--causal] [--folder DIR] [--top 10] [--spread 10] [--rounds 30]

On a machine with two GPUs, in one call: every valid config of the problem measured on GPUs 0 and 1
(``tuner tune --sampler grid --no-early-stop --retime 0 --warm-start 0``, a new database), then
``--top`` configs of the fastest and ``--spread`` more spread over the rest (by stored normalized
median) timed again interleaved on the reference GPU (whose first timing of the anchor is the
study's standard), beside the study's anchor, ``--rounds`` rounds (``GpuBench.retime``). A
re-timed median is put in the standard's terms by the anchor timed in the same rounds (re-timed x
standard / anchor re-timed). Prints a table (stored +- interval, re-timed raw and in the
standard's terms, the difference), how many of the top configs' pairs that differ by more than
their intervals keep their order, ``tuner best`` of the study, and one JSON line ``DRIFT {...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))


def retime_configs(spec_path: str) -> None:
    """In a process that sees one GPU: the configs of ``spec_path`` timed interleaved; print JSON."""
    from multigpu_check import _compiled
    from workers.gpu import GpuBench

    spec = json.loads(Path(spec_path).read_text())
    _, problem, kernels = _compiled(spec)
    bench = GpuBench(0)
    try:
        info = bench.device_info()
        turns = bench.retime(kernels, "attention", problem, rounds=spec["rounds"], max_seconds=120)
    finally:
        bench.close()
    if not all(m.ok for m in turns.measurements):
        sys.exit(f"a config failed: {[m.reason for m in turns.measurements if not m.ok]}")
    print(json.dumps({"gpu": info.identity, "ms": [m.timing.median_ms for m in turns.measurements],
                      "min": [m.timing.min_ms for m in turns.measurements],
                      "iqr": [m.timing.iqr_ms for m in turns.measurements], "rounds": turns.rounds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2,32,4096,128")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/drift"))
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--spread", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--retime-configs", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.retime_configs:
        retime_configs(args.retime_configs)
        return

    import tuner
    from storage import tied

    args.folder.mkdir(parents=True, exist_ok=True)
    db, cache = f"sqlite:///{args.folder / 'tuner.db'}", args.folder / "cache"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TUNER_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "tuner", "tune", "attention", "--shape", args.shape, "--dtype", args.dtype,
           *(["--causal"] if args.causal else []), "--sampler", "grid", "--no-early-stop", "--retime", "0",
           "--warm-start", "0", "--db", db, "--json"]
    began = time.monotonic()
    with (args.folder / "tune.log").open("w") as log:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, timeout=480)
    if done.returncode != 0:
        sys.exit(f"the grid failed: {(args.folder / 'tune.log').read_text()[-2000:]}")
    lines = done.stdout.splitlines()
    result = json.loads("\n".join(lines[lines.index("{"):]))
    grid_s = time.monotonic() - began
    trials = [t for t in tuner.show(result["study"], db=db).trials if t.ok and t.normalized_ms]
    ranked = sorted(trials, key=lambda t: t.ranked_ms)
    # the reference: its trials before its second timing of the anchor carry the ratio 1 exactly
    reference = next((t.gpu_uuid for t in sorted(trials, key=lambda t: t.number) if t.gpu_ratio == 1.0),
                     next(t.gpu_uuid for t in trials if t.gpu_index == min(u.gpu_index for u in trials)))
    paired = sum("anchor_ratio" in (t.gpu_state or {}) for t in trials)
    anchored = [t for t in trials if (t.gpu_state or {}).get("anchor") and t.gpu_ratio]
    anchor_key = anchored[0].gpu_state["anchor"]
    standard = anchored[0].gpu_ratio * anchored[0].gpu_state["anchor_ms"]
    rest = ranked[args.top:]
    picked = ranked[:args.top] + [rest[int(i * (len(rest) - 1) / max(1, args.spread - 1))]
                                  for i in range(args.spread)]
    configs = [t.params for t in picked] + [json.loads(anchor_key)]
    spec = {"shape": args.shape, "dtype": args.dtype, "causal": args.causal, "configs": configs,
            "rounds": args.rounds, "cache": str(cache)}
    (args.folder / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(HERE), "--retime-configs", str(args.folder / "spec.json")],
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": reference, "TUNER_CACHE": str(cache)},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"the re-timing failed: {done.stderr[-2000:]}")
    again = json.loads(done.stdout.strip().splitlines()[-1])
    anchor_now = again["ms"][-1]
    rows = []
    print(f"grid: {result['measured']} configs in {grid_s:.0f} s on 2 GPUs; anchor {anchor_key}, standard "
          f"{standard:.4f} ms, re-timed now {anchor_now:.4f} ms on the reference ({reference})")
    print("| rank | trial | GPU | stored ms | +- | re-timed raw | in standard terms | difference |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (t, raw) in enumerate(zip(picked, again["ms"])):
        standard_terms = raw * standard / anchor_now
        diff = t.ranked_ms / standard_terms - 1
        rows.append({"rank": ranked.index(t) + 1, "trial": t.number, "gpu": t.gpu_index, "stored": t.ranked_ms,
                     "interval": t.interval_ms, "retimed": raw, "standard_terms": standard_terms, "diff": diff,
                     "raw": t.median_ms, "min": t.min_ms, "iqr": t.iqr_ms, "ratio": t.gpu_ratio,
                     "anchor_ms": (t.gpu_state or {}).get("anchor_ms"), "retimed_min": again["min"][i],
                     "retimed_iqr": again["iqr"][i]})
        print(f"| {ranked.index(t) + 1} | #{t.number} | {t.gpu_index} | {t.ranked_ms:.4f} | {t.interval_ms:.4f} | "
              f"{raw:.4f} | {standard_terms:.4f} | {100 * diff:+.2f}% |")
    within = sum(abs(r["diff"]) <= 0.02 for r in rows)
    within_raw = sum(abs(r["stored"] / r["retimed"] - 1) <= 0.02 for r in rows)
    print(f"{paired} of {len(trials)} trials timed beside the anchor; {within_raw} of {len(rows)} stored values "
          f"within 2% of the raw re-timing")
    top = rows[:args.top]
    pairs = kept = 0
    for i in range(len(top)):
        for j in range(i + 1, len(top)):
            a, b = top[i], top[j]
            if not tied(a["stored"], a["interval"], b["stored"], b["interval"]):
                pairs += 1
                kept += (a["stored"] < b["stored"]) == (a["standard_terms"] < b["standard_terms"])
    print(f"{within} of {len(rows)} within 2% of their stored values; of the top {len(top)}'s pairs apart by more "
          f"than their intervals, {kept} of {pairs} keep their order")
    best = subprocess.run([sys.executable, "-m", "tuner", "best", "attention", "--shape", args.shape, "--dtype",
                           args.dtype, *(["--causal"] if args.causal else []), "--db", db],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    print(best.stdout)
    print("DRIFT " + json.dumps({"grid_s": grid_s, "measured": result["measured"], "standard": standard,
                                 "anchor_now": anchor_now, "rows": rows, "within_2pct": within, "within_2pct_raw": within_raw, "paired": paired,
                                 "ordered_pairs": [kept, pairs], "reference": reference}))


if __name__ == "__main__":
    main()
