"""The masks in a branch of their own (2026-11-23): the previous templates' kernels beside
today's on the winners of template 1abdd17792740402, and cuDNN, one process, one GPU.

    PYTHONPATH=OLD_CHECKOUT python3 docs/scripts/mask_check.py --write-old DIR   # on any machine
    python3 docs/scripts/mask_check.py DIR                                       # on the GPU

The first renders the winners with an older checkout's templates into DIR (host code only). The
second compiles both sets on all cores, checks today's kernels on odd problems of their D (the
workers' checks against the float64 reference: S = 1, 65, 1000, 4097, more tiles than SMs),
then times each winner's two versions in turn (three rounds, held timing, medians) and once
each by ``triton.testing.do_bench``, and cuDNN on the same inputs both ways. Prints a table.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from templates import get_family

FAMILY = get_family("attention")
TMA = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=128, STAGES=2, SMEM_LAYOUT="swizzle",
           WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1,
           PINGPONG=1, EPILOGUE="st16")
# The fp16 winners of template 1abdd17792740402 (2026-11-23), fastest-first on each problem.
CASES = (
    ("16,16,2048,64", False, dict(TMA, BLOCK_N=176, SCHEDULE="persistent", EPILOGUE="tma")),
    ("16,16,2048,64", True, dict(TMA, PRODUCER_REGS=56, SCHEDULE="persistent", TILE_ORDER="lpt")),
    ("8,16,2048,128", False, dict(TMA, SCHEDULE="persistent")),
    ("4,16,4096,128", False, dict(TMA, BLOCK_N=176)),
    ("4,16,4096,128", True, dict(TMA, PINGPONG=0, SCHEDULE="persistent", TILE_ORDER="lpt")),
)
# The cp.async paths (kernel.cu.j2) changed the same way: checked on the odd problems too.
CP_ASYNC = (
    (128, True, dict(FAMILY.default_params(), BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, STAGES=3, SMEM_LAYOUT="swizzle",
                     WARP_SPECIALIZED=0, Q_IN_REGS=1, MMA="wgmma")),
    (64, False, dict(FAMILY.default_params(), BLOCK_M=128, BLOCK_N=64, NUM_WARPS=4, STAGES=2, SMEM_LAYOUT="pad8",
                     WARP_SPECIALIZED=0, Q_IN_REGS=0, MMA="sync")),
)
ODD = ("2,3,1,{d}", "2,3,65,{d}", "2,3,1000,{d}", "1,3,4097,{d}", "8,16,1000,{d}")


def problem_of(shape: str, causal: bool):
    return FAMILY.parse_problem(shape, "fp16", {"causal": causal})


def write_old(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, (shape, causal, params) in enumerate(CASES):
        (folder / f"{i}.cu").write_text(FAMILY.render(params, problem_of(shape, causal)))
    print(f"wrote {len(CASES)} sources into {folder}")


def main(old: Path) -> None:
    import torch

    from templates.attention import peers
    from workers.compile import compile_all
    from workers.local import LocalBench
    from workers.peers import _time_one, held_timer
    from workers.results import CompileRequest

    cases = [(problem_of(s, c), p, (old / f"{i}.cu").read_text()) for i, (s, c, p) in enumerate(CASES)]
    odd = [(problem_of(shape.format(d=p.shape[3]), dict(p.flags)["causal"]), params)
           for p, params, _ in cases for shape in ODD]
    odd += [(FAMILY.parse_problem(shape.format(d=d), "fp16", {"causal": c}), params)
            for d, c, params in CP_ASYNC for shape in ODD]
    sources = ([(FAMILY.render(params, p), FAMILY.compile_options(params, p)) for p, params in odd]
               + [(s, FAMILY.compile_options(params, p)) for p, params, s in cases])
    start = time.time()
    errors = compile_all([CompileRequest(source, "attention_fwd", options) for source, options in sources])
    print(f"compiled {len(sources)} in {time.time() - start:.0f} s; errors {len(errors)} {errors[:2]}", flush=True)
    rows = []
    with LocalBench() as local:
        failed = local.failures(FAMILY, odd)
        for line in failed:
            print(f"CHECK FAILED {line}", flush=True)
        print(f"checked {len(odd)} (config, odd problem) pairs: {len(failed)} failed", flush=True)
        for p, params, old_source in cases:
            launch, options = FAMILY.launch(params, p), FAMILY.compile_options(params, p)
            new_source = FAMILY.render(params, p)
            times: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(3):
                for name, source in (("new", new_source), ("old", old_source)):
                    m = local.measure("attention", p, source, launch, options)
                    times[name].append(m.timing.median_ms if m.ok else float("nan"))
                    if not m.ok:
                        print(f"{p.key} {name}: {m.failure}: {m.reason}", flush=True)
            bench = {name: local.do_bench("attention", p, source, launch, options)
                     for name, source in (("new", new_source), ("old", old_source))}
            host = FAMILY.inputs(p, 0)
            timer = held_timer(torch)
            try:
                cudnn = _time_one(torch, timer, "cudnn", peers.peer_calls(p, host)["cudnn"].run, FAMILY, p, host,
                                  100, True)
            finally:
                timer.hold.close()
            median = {k: sorted(v)[1] for k, v in times.items()}
            rows.append((p, median, bench, cudnn))
            print(json.dumps({"problem": p.key, "held_ms": times, "do_bench_ms": bench,
                              "cudnn_ms": [cudnn.median_ms, cudnn.check_ms]}), flush=True)
    print("\n| problem | old us | new us | new speed-up | new TFLOPS | vs cuDNN old | vs cuDNN new | "
          "do_bench: speed-up, vs cuDNN new |")
    print("|---|---|---|---|---|---|---|---|")
    for p, median, bench, cudnn in rows:
        c, cb = cudnn.median_ms or float("nan"), cudnn.check_ms or float("nan")
        nb, ob = bench["new"] or float("nan"), bench["old"] or float("nan")
        print(f"| {p.key} | {median['old'] * 1e3:.1f} | {median['new'] * 1e3:.1f} | {median['old'] / median['new']:.3f}x "
              f"| {FAMILY.tflops(p, median['new']):.0f} | {c / median['old']:.2f}x | {c / median['new']:.2f}x "
              f"| {ob / nb:.3f}x, {cb / nb:.2f}x |")


if __name__ == "__main__":
    if sys.argv[1] == "--write-old":
        write_old(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
