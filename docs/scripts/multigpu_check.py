"""Two GPUs' timings as one set, and a study's throughput on one GPU and on two.

    PYTHONPATH=<checkout> python3 docs/scripts/multigpu_check.py [--trials 200]
        [--shape 4,16,4096,128] [--dtype fp16] [--causal] [--sampler tpe] [--configs 10] [--rounds 3]
        [--prime] [--folder DIR] [--study-timeout S] [--round-noise N] [--full-rounds] [--no-one-gpu]

On a machine with two GPUs, in one call (about two minutes for the defaults on two H100s: a
cold 200-trial study took 51 s on one GPU and 27 s on two):

1. the same study (a new database, seed 0) on one GPU (``CUDA_VISIBLE_DEVICES=0``), then on two
   (``0,1``; PCI bus order, as nvidia-smi numbers them), each a ``tuner tune --json`` process, each
   on an empty compile cache, or with ``--prime`` both on the cache a first one-GPU study filled:
   trials per minute (measured trials over the study's wall time, the final re-timing included),
   and the two-GPU figure over the one-GPU one (target: 1.9x or more; the two-GPU study pays for
   its GPUs' timings of the incumbent). Each study's log is ``tune.log`` in its folder. Where the
   wall time went is printed beside (the steady rate, the GPUs' busy share, the seconds outside the
   span of the stored trials: start and final re-timing). TPE's configs depend on the order results
   come back, so the two studies measure different mixes of fast and slow configs; ``--sampler
   random`` measures the same configs on both (``--configs 0``: the rates only). ``--no-one-gpu``:
   the two-GPU study alone; ``--full-rounds``: its incumbent's rounds timed as a trial is, not with
   ``CALIBRATE_TIMING``. The ratio the study stored for the other GPU is printed as it moved;
2. the two-GPU study's ``--configs`` fastest configs (by normalized median, distinct cubins),
   timed again on each GPU, the two GPUs at once, each in its own process (``GpuBench.measure``
   as a trial times them, ``--rounds`` rounds, the median): the other GPU's medians over the
   reference's (the GPU whose trials carry ratio 1, where the re-timing ran) as measured, then
   normalized by the ratio the study ended with (what its last trials were scaled by), and by the
   ratio of the incumbent (the study's best) timed beside them (target: within 1%). Then the same
   configs timed in turns on each GPU (``GpuBench.retime``: A B C ... A B C ..., ``--turns``
   rounds, as the final re-timing), each normalized by the incumbent's median of the same turns:
   a GPU's drift of clocks during the timings then moves every config alike;
3. with ``--round-noise N``: the two-GPU study's best config timed N times on each GPU (both at
   once, each in its own process) as a calibration round times it (``CALIBRATE_TIMING``) and as a
   trial does, the two kinds alternating: how much the other GPU's ratio to the reference moves
   from one timing to the next with each kind (a round's ratio is one such pair).

It prints a short table, then one JSON line (``MULTIGPU {...}``) with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def study(gpus: str, folder: Path, cache: Path, args: argparse.Namespace) -> tuple[str, dict]:
    """A study with a new database on ``gpus`` (CUDA_VISIBLE_DEVICES) in its own process, compiling
    into ``cache``: (db, tune --json)."""
    folder.mkdir(parents=True)
    db = f"sqlite:///{folder / 'tuner.db'}"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "TUNER_CACHE": str(cache)}
    env.pop("TUNER_DB", None)
    # --full-rounds: the study's calibration rounds time the incumbent as a trial does
    run = ["-c", "import sys, workers.calibrate as c; c.CALIBRATE_TIMING.clear(); "
           "from tuner.cli.commands import main; sys.exit(main())"] if args.full_rounds else ["-m", "tuner"]
    cmd = [sys.executable, *run, "tune", "attention", "--shape", args.shape, "--dtype",
           args.dtype, *(["--causal"] if args.causal else []), "--trials", str(args.trials),
           "--db", db, "--seed", "0", "--sampler", args.sampler, "--json"]
    log = folder / "tune.log"  # the study's progress lines, as it runs
    print(f"study on GPUs {gpus}: {' '.join(cmd[1:])} (log: {log})", flush=True)
    start = time.monotonic()
    with log.open("w") as err:
        done = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=err, text=True, timeout=args.study_timeout)
    if done.returncode != 0:
        sys.exit(f"tune on GPUs {gpus} failed ({done.returncode}): {log.read_text()[-2000:]}")
    lines = done.stdout.splitlines()  # the summary: from the line "{" on (Ray may print before it)
    result = json.loads("\n".join(lines[lines.index("{"):]))
    result["call_s"] = time.monotonic() - start
    result["phases"] = phases(db, result)
    return db, result


def phases(db: str, result: dict) -> dict:
    """Where a study's wall time went, from its stored trials' times: the first trial stored (start-up,
    first compiles), the steady rate between the 10th trial and the last, and the tail after the last
    (the final re-timing); the GPUs' busy share and the compile CPU seconds."""
    import tuner

    trials = sorted(tuner.show(result["study"], db=db).trials, key=lambda t: t.created_at)
    stamps = [t.created_at.timestamp() for t in trials]
    first, last = stamps[0], stamps[-1]
    steady = stamps[9:]
    gpus = {t.gpu_uuid for t in trials if t.gpu_uuid} or {None}
    return {
        "span_s": round(last - first, 2),  # first to last stored trial
        "steady_per_min": round(60 * (len(steady) - 1) / (steady[-1] - steady[0]), 1)
        if len(steady) > 1 and steady[-1] > steady[0] else None,
        # the last 100 stored trials: a study that slows as it grows shows it here
        "late_per_min": round(60 * (len(late) - 1) / (late[-1] - late[0]), 1)
        if len(late := stamps[-100:]) > 1 and late[-1] > late[0] else None,
        "gpus": len(gpus),
        "busy_share": round(result["gpu_busy_s"] / (len(gpus) * result["elapsed_s"]), 3),
        "kernel_share": round(result.get("kernel_busy_s", 0.0) / (len(gpus) * result["elapsed_s"]), 3),
        "compile_cpu_s": round(sum(t.compile_seconds or 0.0 for t in trials), 1),
        "outside_span_s": round(result["elapsed_s"] - (last - first), 2),  # start-up + tail
        "trials_per_gpu": {str(t): sum(1 for x in trials if x.gpu_uuid == t) for t in gpus},
    }


def time_configs(spec_path: str) -> None:
    """In a process that sees one GPU: time the configs of ``spec_path``; print JSON."""
    from workers.gpu import GpuBench

    spec = json.loads(Path(spec_path).read_text())
    _, problem, kernels = _compiled(spec)
    bench = GpuBench(0)
    try:
        info = bench.device_info()
        before = bench.clocks_now()
        medians: list[list[float]] = [[] for _ in kernels]
        for _ in range(spec["rounds"]):
            for i, (binary, launch) in enumerate(kernels):
                m = bench.measure(binary, launch, "attention", problem, seed=0)
                if not m.ok:
                    sys.exit(f"config {i} failed on {info.uuid}: {m.failure}: {m.reason}")
                medians[i].append(m.timing.median_ms)
        after = bench.clocks_now()
        turns = bench.retime(kernels, "attention", problem, rounds=spec["turns"], max_seconds=60)
        if not all(m.ok for m in turns.measurements):
            sys.exit(f"the configs in turns failed on {info.uuid}: {[m.reason for m in turns.measurements]}")
    finally:
        bench.close()
    print(json.dumps({"gpu": info.identity, "medians": [statistics.median(x) for x in medians],
                      "turns": [m.timing.median_ms for m in turns.measurements], "turn_rounds": turns.rounds,
                      "clocks": {"before": before, "after": after}}))


def _compiled(spec: dict) -> tuple[Any, Any, list]:
    """The attention problem of ``spec`` and its configs compiled: (family, problem, kernels)."""
    from templates import get_family
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    family = get_family("attention")
    problem = family.parse_problem(spec["shape"], spec["dtype"], {"causal": spec["causal"]})
    kernels = []
    for params in spec["configs"]:
        launch = family.launch(params, problem)
        request = CompileRequest(family.render(params, problem), launch.kernel,
                                 tuple(family.compile_options(params, problem)))
        kernels.append((compile_cubin(request, cache_dir=spec["cache"]), launch))
    return family, problem, kernels


def time_rounds(spec_path: str) -> None:
    """In a process that sees one GPU: the first config of ``spec_path`` timed ``rounds`` times as a
    calibration round does and as a trial does, alternating (which kind goes first alternates too);
    print JSON."""
    from workers.calibrate import CALIBRATE_TIMING
    from workers.gpu import GpuBench

    spec = json.loads(Path(spec_path).read_text())
    _, problem, kernels = _compiled(spec)
    binary, launch = kernels[0]
    bench = GpuBench(0)
    kinds = {"round": dict(CALIBRATE_TIMING), "trial": {}}
    medians: dict[str, list[float]] = {k: [] for k in kinds}
    clocks: dict[str, list[dict]] = {k: [] for k in kinds}  # each timing's, before and after
    try:
        info = bench.device_info()
        for i in range(spec["rounds"]):
            for kind in (("round", "trial") if i % 2 == 0 else ("trial", "round")):
                m = bench.measure(binary, launch, "attention", problem, seed=0, **kinds[kind])
                if not m.ok:
                    sys.exit(f"the config failed on {info.uuid}: {m.failure}: {m.reason}")
                medians[kind].append(m.timing.median_ms)
                clocks[kind].append(m.clocks)
    finally:
        bench.close()
    print(json.dumps({"gpu": info.identity, "medians": medians, "clocks": clocks}))


def round_noise(db: str, two: dict, cache: Path, folder: Path, args: argparse.Namespace) -> dict:
    """Step 3: the study's best config timed on both GPUs at once, as rounds and as trials; prints
    each kind's spread of the other GPU's ratio and returns the numbers."""
    import tuner

    trials = [t for t in tuner.show(two["study"], db=db).trials if t.ok]
    reference, other = _reference_and_other(trials)
    best = min(trials, key=lambda t: t.normalized_ms or t.median_ms)
    spec = {"shape": args.shape, "dtype": args.dtype, "causal": args.causal, "configs": [best.params],
            "rounds": args.round_noise, "cache": str(cache)}
    ref, oth = _on_both(reference, other, spec, folder / "rounds.json", "--time-rounds")
    out = {}
    print(f"trial #{best.number} timed {args.round_noise} times on each GPU at once, as a round "
          f"and as a trial (alternating): the other GPU's ratio to the reference")
    for kind in ("round", "trial"):
        ratios = [a / b for a, b in zip(ref["medians"][kind], oth["medians"][kind])]
        steps = [abs(b / a - 1) for a, b in zip(ratios, ratios[1:])]
        out[kind] = {"ratios": ratios, "reference_ms": ref["medians"][kind], "other_ms": oth["medians"][kind],
                     "reference_clocks": ref["clocks"][kind], "other_clocks": oth["clocks"][kind]}
        print(f"  {kind:>5}: ratio median {statistics.median(ratios):.4f}, stdev "
              f"{100 * statistics.pstdev(ratios) / statistics.mean(ratios):.2f}%, range "
              f"{100 * (max(ratios) / min(ratios) - 1):.2f}%, median step {100 * statistics.median(steps):.2f}%")
    return out


def time_on_both(reference: str, other: str, configs: list[dict], folder: Path, cache: str,
                 args: argparse.Namespace) -> tuple[dict, dict]:
    """The configs timed on each GPU (by uuid), both at once, each in its own process."""
    spec = {"shape": args.shape, "dtype": args.dtype, "causal": args.causal, "configs": configs,
            "rounds": args.rounds, "turns": args.turns, "cache": cache}
    return _on_both(reference, other, spec, folder / "configs.json", "--time-configs")


def _on_both(reference: str, other: str, spec: dict, path: Path, flag: str) -> tuple[dict, dict]:
    """``flag``'s timing of ``spec`` on each GPU (by uuid), both at once, each in its own process."""
    path.write_text(json.dumps(spec))
    cache = spec["cache"]
    procs = [subprocess.Popen([sys.executable, str(HERE), flag, str(path)],
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "TUNER_CACHE": cache},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for uuid in (reference, other)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode != 0:
            sys.exit(f"timing the configs failed: {stderr[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--shape", default="4,16,4096,128")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--sampler", default="tpe", help="the studies' sampler: random measures the "
                        "same configs on one GPU and on two (seed 0), so that their rates compare "
                        "the GPUs alone and not two searches' mixes of fast and slow configs")
    parser.add_argument("--configs", type=int, default=10, help="configs timed on each GPU afterwards "
                        "(0: none, the rates only)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=100, help="rounds of the configs timed in turns")
    parser.add_argument("--prime", action="store_true",
                        help="time both studies on a compile cache a first one-GPU study filled "
                        "(where compiling, not the GPUs, would set a cold study's pace)")
    parser.add_argument("--study-timeout", type=float, default=600, help="seconds a study may take")
    parser.add_argument("--folder", type=Path, help="where the studies' databases and logs go "
                        "(default: a new temporary folder)")
    parser.add_argument("--full-rounds", action="store_true",
                        help="the studies' calibration rounds time the incumbent as a trial does")
    parser.add_argument("--one-gpu", action=argparse.BooleanOptionalAction, default=True,
                        help="also the one-GPU study (--no-one-gpu: the two-GPU study alone)")
    parser.add_argument("--round-noise", type=int, default=0, metavar="N",
                        help="time the best config N times on each GPU as a round and as a trial")
    parser.add_argument("--time-configs", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--time-rounds", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_configs:
        time_configs(args.time_configs)
        return
    if args.time_rounds:
        time_rounds(args.time_rounds)
        return

    folder = args.folder or Path(tempfile.mkdtemp(prefix="multigpu-"))
    cold = None
    if args.prime:  # a first one-GPU study fills the compile cache both timed studies share
        _, cold = study("0", folder / "prime", folder / "cache", args)
    one = study("0", folder / "one", folder / ("cache" if cold else "one/cache"), args)[1] \
        if args.one_gpu else None
    cache = folder / ("cache" if cold else "two/cache")
    db, two = study("0,1", folder / "two", cache, args)
    per_min = {n: 60 * r["measured"] / r["elapsed_s"] for n, r in ((1, one), (2, two)) if r}
    state = "warm (cache primed)" if cold else "cold"
    print(f"{state} {args.trials}-trial study ({args.sampler}), attention {args.shape} {args.dtype}"
          f"{' causal' if args.causal else ''}:")
    if cold:
        print(f"  priming study (1 GPU, cold): {60 * cold['measured'] / cold['elapsed_s']:.0f} "
              f"trials/min")
    ran = [(n, r) for n, r in ((1, one), (2, two)) if r]
    speedup = per_min[2] / per_min[1] if one else None
    print("  trials/min  " + "   ".join(f"{n} GPU(s) {per_min[n]:.0f}" for n, _ in ran)
          + (f"   {speedup:.2f}x (target >= 1.9x)" if speedup else ""))
    for n, r in ran:
        ph = r["phases"]
        print(f"  {n} GPU(s): wall {r['elapsed_s']:.1f} s, trials stored over {ph['span_s']:.1f} s "
              f"(outside that {ph['outside_span_s']:.1f} s), steady {ph['steady_per_min']} trials/min, "
              f"last 100 trials {ph['late_per_min']}/min, "
              f"GPU busy {100 * ph['busy_share']:.0f}% (kernels {100 * ph['kernel_share']:.0f}%), "
              f"compile {ph['compile_cpu_s']:.0f} CPU s, per GPU {ph['trials_per_gpu']}")
    rates = {"problem": f"{args.shape} {args.dtype} causal={args.causal}", "trials": args.trials,
             "sampler": args.sampler, "full_rounds": args.full_rounds,
             "trials_per_min": {str(n): round(per_min[n], 1) for n, _ in ran},
             "speedup": round(speedup, 3) if speedup else None, "primed": bool(cold),
             "studies": {str(n): {k: r[k] for k in ("study", "measured", "elapsed_s", "call_s", "phases")}
                         for n, r in ran}}
    rates["stored_ratios"] = stored_ratios(db, two)
    if args.configs > 0:
        rates.update(compare_configs(db, two, cache, folder, args))
    if args.round_noise > 0:
        rates["round_noise"] = round_noise(db, two, cache, folder, args)
    print("MULTIGPU " + json.dumps(rates))


def _reference_and_other(trials: list) -> tuple[str, str]:
    """The two-GPU study's GPUs (uuids): the reference (its trials' ratio is 1) and the other."""
    reference = next(t.gpu_uuid for t in trials if t.gpu_ratio == 1.0)
    return reference, next(t.gpu_uuid for t in trials if t.gpu_uuid and t.gpu_uuid != reference)


def stored_ratios(db: str, two: dict) -> list[float]:
    """The other GPU's ratios to the reference as the two-GPU study stored them on its trials, each
    new value once, in trial order; printed with how far they moved."""
    import tuner

    trials = sorted((t for t in tuner.show(two["study"], db=db).trials if t.ok), key=lambda t: t.number)
    _, other = _reference_and_other(trials)
    ratios: list[float] = []
    for t in trials:
        if t.gpu_uuid == other and t.gpu_ratio is not None and (not ratios or ratios[-1] != t.gpu_ratio):
            ratios.append(t.gpu_ratio)
    if ratios:
        print(f"  the other GPU's stored ratio: {len(ratios)} values, first {ratios[0]:.4f}, last "
              f"{ratios[-1]:.4f}, range {100 * (max(ratios) / min(ratios) - 1):.2f}%")
    return ratios


def compare_configs(db: str, two: dict, cache: Path, folder: Path, args: argparse.Namespace) -> dict:
    """Step 2: the two-GPU study's fastest configs timed again on each GPU; prints the table and
    returns its numbers."""
    import tuner
    from tuner.study.final_best import candidates

    trials = tuner.show(two["study"], db=db).trials
    ok = [t for t in trials if t.ok]
    gpus = {t.gpu_uuid: t.gpu_index for t in ok}
    reference, other = _reference_and_other(ok)
    study_ratio = [t.gpu_ratio for t in sorted(ok, key=lambda t: t.number)
                   if t.gpu_uuid == other and t.gpu_ratio is not None][-1]
    picked = candidates(ok, args.configs)
    ref, oth = time_on_both(reference, other, [t.params for t in picked], folder,
                            str(cache), args)
    now_ratio = ref["medians"][0] / oth["medians"][0]  # the incumbent: the study's best

    turns_ratio = ref["turns"][0] / oth["turns"][0]  # the incumbent, in the same turns as the others
    rows, raw, by_study, by_now, by_turns = [], [], [], [], []
    for t, a, b, ta, tb in zip(picked, ref["medians"], oth["medians"], ref["turns"], oth["turns"]):
        raw.append(b / a - 1)
        by_study.append(b * study_ratio / a - 1)
        by_now.append(b * now_ratio / a - 1)
        by_turns.append(tb * turns_ratio / ta - 1)
        rows.append((t.number, a, b, raw[-1], by_study[-1], by_now[-1], by_turns[-1]))

    print(f"reference GPU {gpus[reference]} ({reference}), other GPU {gpus[other]} ({other})")
    print(f"  other's ratio to the reference: study's last {study_ratio:.4f}, "
          f"incumbent timed now {now_ratio:.4f}")
    print(f"  {'trial':>6} {'ref ms':>9} {'other ms':>9} {'raw':>8} {'norm.study':>11} {'norm.now':>9} "
          f"{'in turns':>9}")
    for number, a, b, d_raw, d_study, d_now, d_turns in rows:
        print(f"  #{number:<5} {a:9.4f} {b:9.4f} {100 * d_raw:+7.2f}% {100 * d_study:+10.2f}% "
              f"{100 * d_now:+8.2f}% {100 * d_turns:+8.2f}%")
    worst = {k: max(abs(d) for d in v)
             for k, v in (("raw", raw), ("study", by_study), ("now", by_now), ("turns", by_turns))}
    print(f"  max |difference|: raw {100 * worst['raw']:.2f}%, normalized by the study's ratio "
          f"{100 * worst['study']:.2f}%, by the ratio now {100 * worst['now']:.2f}%, in turns "
          f"{100 * worst['turns']:.2f}% (target < 1%)")
    return {
        "reference": ref["gpu"], "other": oth["gpu"], "study_ratio": study_ratio,
        "now_ratio": now_ratio, "turns_ratio": turns_ratio,
        "turn_rounds": [ref["turn_rounds"], oth["turn_rounds"]],
        "configs": [dict(zip(("trial", "ref_ms", "other_ms", "raw", "normalized_study", "normalized_now",
                              "normalized_in_turns"), r)) for r in rows],
        "turns": {"reference": ref["turns"], "other": oth["turns"]},
        "clocks": {"reference": ref["clocks"], "other": oth["clocks"]}}

if __name__ == "__main__":
    main()
