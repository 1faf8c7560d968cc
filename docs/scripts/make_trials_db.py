"""Write a large, realistic results database through the storage layer, for `tuner serve`'s load test.

    .venv/bin/python docs/scripts/make_trials_db.py /tmp/big.db --trials 100000

Each recorded attention landscape (tests/data and the family's shipped ones) is replayed many
times: under problems of the same dtype, causal flag and head dimension at other batch, head and
sequence sizes (each median scaled by the problem's FLOPs over the landscape's, times a few
percent of seeded noise), on two GPU names, each a study of ``--per-study`` trials in a shuffled
order, recorded one trial at a time by ``Repository.record_trial`` (so the stored bests are
kept as a tuning run keeps them), then its five fastest re-timed (``record_retiming``). Nothing
here needs a GPU; the trials say ``replayed``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from storage import RetimeEntry, TrialOutcome, open_repository  # noqa: E402
from templates import get_family  # noqa: E402
from tuner.study import search  # noqa: E402

GPUS = ({"name": "NVIDIA H200", "sm_count": 132, "compute_capability": [9, 0]},
        {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_capability": [9, 0]})
BATCHES, HEADS, SEQS = (1, 2, 4, 8, 16), (8, 16, 32), (512, 1024, 2048, 4096, 8192, 16384)


def landscapes() -> list[dict]:
    files = sorted((ROOT / "tests" / "data").glob("attention_*.json"))
    files += sorted((ROOT / "templates" / "attention" / "landscapes").glob("*.json"))
    return [json.loads(path.read_text()) for path in files]


def outcome(entry: dict, scale: float, noise: float, tflops: float | None) -> TrialOutcome:
    m = entry["measurement"]
    res = m.get("resources") or {}
    timing = m.get("timing")
    common = dict(failure=m.get("failure"), reason=m.get("reason"), detail=m.get("detail") or "",
                  registers=res.get("registers"), smem_static=res.get("smem_static"),
                  stack_bytes=res.get("stack_bytes"), spill_stores=res.get("spill_stores"),
                  spill_loads=res.get("spill_loads"), cubin_hash=m.get("cubin_hash"),
                  toolkit=m.get("toolkit"), compile_seconds=m.get("compile_seconds"), replayed=True,
                  gpu_state=m.get("clocks") or None)
    if not m["ok"] or timing is None:
        return TrialOutcome("failed", **common)
    f = scale * noise
    median = timing["median_ms"] * f
    return TrialOutcome("ok", median_ms=median, min_ms=timing["min_ms"] * f, max_ms=timing["max_ms"] * f,
                        iqr_ms=timing["iqr_ms"] * f, repetitions=timing["repetitions"],
                        tflops=tflops / f if tflops else None, error=m.get("error"),
                        max_abs_error=m.get("max_abs_error"), **common)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="SQLite file to write (must not exist), or a database URL")
    parser.add_argument("--trials", type=int, default=100_000, help="trials in all (default 100000)")
    parser.add_argument("--per-study", type=int, default=500, help="trials a study (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    url = args.db if "://" in args.db else f"sqlite:///{Path(args.db).resolve()}"
    if "://" not in args.db and Path(args.db).exists():
        parser.error(f"{args.db} exists; give a new file")
    rng = random.Random(args.seed)
    fam = get_family("attention")
    space = {p.name: list(p.choices) for p in fam.params}
    sources = landscapes()
    plan = []  # (landscape, problem, gpu)
    for land in sources:
        spec = land["problem"]
        b0, h0, s0, d = spec["shape"]
        for gpu in GPUS:
            for b in BATCHES:
                for h in HEADS:
                    for s in SEQS:
                        if (b, h, s) != (b0, h0, s0) and b * h * s <= 16 * 32 * 8192:
                            plan.append((land, fam.parse_problem([b, h, s, d], spec["dtype"],
                                                                 {"causal": spec["causal"]}), gpu))
    rng.shuffle(plan)
    seen, studies = set(), []
    for land, problem, gpu in plan:  # one study per (problem, GPU)
        if (problem.key, gpu["name"]) not in seen:
            seen.add((problem.key, gpu["name"]))
            studies.append((land, problem, gpu))
    need = -(-args.trials // args.per_study)
    if need > len(studies):
        parser.error(f"{args.trials} trials need {need} studies of {args.per_study}; only {len(studies)} problems")
    started, written = time.monotonic(), 0
    with open_repository(url) as repo:
        for index, (land, problem, gpu) in enumerate(studies[:need]):
            count = min(args.per_study, args.trials - written)
            spec = land["problem"]
            source = fam.parse_problem(spec["shape"], spec["dtype"], {"causal": spec["causal"]})
            scale = fam.flops(problem) / fam.flops(source)
            device = {**gpu, "driver_version": land["device"]["driver_version"],
                      "cuda_version": land["device"]["cuda_version"],
                      "max_smem_per_block_optin": land["device"].get("max_smem_per_block_optin", 232448)}
            name = search.study_name(fam.name, fam.template_hash, problem, gpu["name"], replay=True)
            record = repo.open_study(
                name, family=fam.name, template_hash=fam.template_hash, space=space,
                shape=list(problem.shape), dtype=problem.dtype, flags=dict(problem.flags),
                device=device, sampler="tpe", replay=True,
                settings={"trials": count, "time_budget": None, "seed": args.seed, "device": device,
                          "warm_start": [], "replay_file": "synthetic"})
            entries = rng.sample(land["entries"], min(count, len(land["entries"])))
            while len(entries) < count:
                entries.append(rng.choice(land["entries"]))
            times = []
            for number, entry in enumerate(entries):
                params = fam.complete(entry["params"])
                timing = entry["measurement"].get("timing")
                noise = rng.uniform(0.97, 1.03)
                tflops = fam.tflops(problem, timing["median_ms"] * scale) if timing else None
                done = repo.record_trial(record.id, number, params, outcome(entry, scale, noise, tflops))
                if done.status == "ok":
                    times.append((done.median_ms, number))
            top = sorted(times)[:5]
            repo.record_retiming(record.id, [RetimeEntry(n, median_ms=ms * rng.uniform(0.99, 1.01),
                                                         repetitions=30) for ms, n in top], replayed=True)
            repo.set_study_status(record.id, "finished")
            written += count
            print(f"{index + 1}/{need} {name}: {count} trials ({written} in all, "
                  f"{time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(f"wrote {written} trials in {need} studies to {url} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
