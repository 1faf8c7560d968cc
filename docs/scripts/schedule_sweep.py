"""The work schedule of the TMA path, measured: one block a tile against persistent blocks, and
one block an SM against two (BLOCK_M=64), beside cuDNN and the Triton peer, held timing, one
process, every output checked against the float64 reference first (the workers' own trial).

    python3 docs/scripts/schedule_sweep.py "16,16,2048,64;2,16,1000,64" fp16 [--causal] [--quick]

Compiles every variant on all cores first (the workers' compile cache); checks each on odd
problems of its D (S = 1, 65, 1000, 4097, and problems of more tiles than the SMs hold, so that a
persistent block takes several), then times them one after another; prints a table per problem,
fastest first.
"""

from __future__ import annotations

import sys
import time

from templates import get_family
from templates.family import H100_LIMITS

FAMILY = get_family("attention")
TMA = dict(FAMILY.default_params(), BLOCK_M=128, NUM_WARPS=8, BLOCK_N=128, STAGES=2, SMEM_LAYOUT="swizzle",
           WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1,
           PINGPONG=1, EPILOGUE="st16")


def variants(head_dim: int, causal: bool, quick: bool) -> list[dict]:
    out = []
    orders = ("head", "lpt") if causal else ("head",)
    for bn in (128, 160, 176) if head_dim == 128 else (128, 176, 192):
        for schedule in ("grid", "persistent"):
            for epilogue in ("st16", "tma"):
                for order in orders:
                    out.append(dict(TMA, BLOCK_N=bn, SCHEDULE=schedule, EPILOGUE=epilogue, TILE_ORDER=order))
    one = dict(TMA, BLOCK_M=64, NUM_WARPS=4, PINGPONG=0, BLOCKS_PER_SM=2)
    for bn, stages in ((64, 2), (128, 3)) + (() if quick else ((176, 2),)):
        for schedule in ("grid", "persistent"):
            for order in orders:
                out.append(dict(one, BLOCK_N=bn, STAGES=stages, SCHEDULE=schedule, TILE_ORDER=order))
    out.append(dict(TMA, BLOCK_M=192, NUM_WARPS=12, PINGPONG=0, INTRA_OVERLAP=0, SCHEDULE="persistent"))
    return out


def short(p: dict) -> str:
    return ("{BLOCK_M}x{BLOCK_N} s{STAGES} r{PRODUCER_REGS} ov{INTRA_OVERLAP} pp{PINGPONG} {EPILOGUE} "
            "{SCHEDULE} {TILE_ORDER} b{BLOCKS_PER_SM}").format(**p)


ODD = ("2,3,1,{d}", "2,3,65,{d}", "2,3,1000,{d}", "1,3,4097,{d}", "8,16,1000,{d}", "3,11,4097,{d}")


def main(shapes: str, dtype: str, causal: bool, quick: bool) -> None:
    from workers.compile import compile_all
    from workers.local import LocalBench
    from workers.peers import time_peers
    from workers.results import CompileRequest

    problems = [FAMILY.parse_problem(s, dtype, {"causal": causal}) for s in shapes.split(";")]
    jobs = [(p, v) for p in problems for v in variants(p.shape[3], causal, quick) if FAMILY.check(v, p, H100_LIMITS) is None]
    start = time.time()
    errors = compile_all([CompileRequest(FAMILY.render(v, p), "attention_fwd", FAMILY.compile_options(v, p))
                          for p, v in jobs])
    print(f"compiled {len(jobs)} in {time.time() - start:.0f} s; errors {len(errors)} {errors[:2]}", flush=True)
    FAMILY.prepare_peers(problems)
    tables = []
    with LocalBench() as local:
        checked, failed = set(), 0
        for p, v in jobs:
            if (p.shape[3], short(v)) in checked:
                continue
            checked.add((p.shape[3], short(v)))
            for shape in ODD:
                odd = FAMILY.parse_problem(shape.format(d=p.shape[3]), dtype, {"causal": causal})
                m = local.measure("attention", odd, FAMILY.render(v, odd), FAMILY.launch(v, odd),
                                  FAMILY.compile_options(v, odd))
                if not m.ok:
                    failed += 1
                    print(f"CHECK FAILED {odd.key} {short(v)}: {m.failure}: {m.reason}", flush=True)
        print(f"checked {len(checked)} variants on {len(ODD)} odd problems each: {failed} failed", flush=True)
        for problem in problems:
            rows = []
            for p, v in jobs:
                if p is not problem:
                    continue
                m = local.measure("attention", problem, FAMILY.render(v, problem), FAMILY.launch(v, problem),
                                  FAMILY.compile_options(v, problem))
                rows.append((m.timing.median_ms if m.ok else None, short(v), "" if m.ok else f"{m.failure}: {m.reason}"[:90]))
                print(f"{problem.key} {short(v)}: {rows[-1][0] or rows[-1][2]}", flush=True)
            peers = time_peers("attention", problem, cross_check=False)
            for name in ("cudnn", "triton"):
                r = peers.get(name)
                if r is not None and r.median_ms:
                    rows.append((r.median_ms, name, ""))
            tables.append((problem, rows))
    for problem, rows in tables:
        print(f"\n{problem.key}")
        print("| config | us | TFLOPS | note |\n|---|---|---|---|")
        for ms, name, note in sorted(rows, key=lambda r: (r[0] is None, r[0] or 0)):
            if ms is None:
                print(f"| {name} | - | - | {note} |")
            else:
                print(f"| {name} | {ms * 1000:.1f} | {FAMILY.tflops(problem, ms):.0f} | {note} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--causal" in sys.argv[3:], "--quick" in sys.argv[3:])
