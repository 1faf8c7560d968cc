"""The gemm family's wgmma path on a GPU: checked on odd problems, then timed beside cuBLAS and the
Triton peer in one process.

    python3 docs/scripts/gemm_hopper_check.py [--quick] [--c-store tma] [--checks-only] [--swap] [--wide]

First every sampled config of the path (tiles, consumer warpgroups, setmaxnreg, stages, split-K,
persistent blocks, clusters) is
compiled on all cores and passes the workers' checks (outputs poisoned, two runs compared, the
float64 reference on sampled rows) on odd problems of each layout, dtype and epilogue: each
failure is printed, then ``checked N (config, problem) pairs: F failed``. Then, on each timed
problem, the candidate configs by the workers' held timing, the fastest again by
``triton.testing.do_bench``, and the family's peers (cuBLAS through torch.matmul, the autotuned
Triton matmul) both ways. A table last. ``--c-store tma``: every config with C stored by TMA
(``C_STORE``); ``--checks-only``: no timings; ``--swap``: the checks of SWAP_AB's tiles instead (A's rows
as the MMA's N) on small-M odd problems; ``--wide``: the checks of the 192- and 224-column tiles instead.
"""

from __future__ import annotations

import sys
import time

from templates import get_family

FAMILY = get_family("gemm")
C_STORE = sys.argv[sys.argv.index("--c-store") + 1] if "--c-store" in sys.argv else "direct"
BASE = dict(FAMILY.default_params(), MMA="wgmma", BLOCK_K=64, SMEM_LAYOUT="swizzle", GROUP_M=8, C_STORE=C_STORE)
# (BLOCK_M, BLOCK_N, NUM_WARPS: 4 a consumer warpgroup, STAGES, PRODUCER_REGS, PERSISTENT, SPLIT_K, CLUSTER_M)
TILES = ((128, 256, 8, 4, 40, 0, 1, 1), (128, 128, 8, 4, 40, 0, 1, 1), (256, 128, 8, 3, 40, 0, 1, 1),
         (128, 128, 4, 4, 40, 0, 1, 1), (64, 128, 4, 4, 0, 0, 1, 1), (64, 64, 4, 4, 0, 0, 4, 1), (128, 64, 8, 3, 0, 0, 1, 1),
         (128, 256, 8, 4, 40, 1, 1, 1), (128, 128, 8, 4, 40, 1, 4, 1), (64, 128, 4, 4, 0, 0, 2, 1),
         (64, 64, 4, 4, 0, 1, 8, 1), (128, 256, 8, 4, 40, 0, 1, 2), (128, 256, 8, 4, 40, 1, 1, 2),
         (64, 128, 4, 4, 0, 0, 4, 2), (128, 128, 8, 4, 40, 1, 2, 2), (256, 128, 8, 4, 24, 0, 1, 2),
         (64, 128, 4, 4, 0, 0, 4, 1), (64, 256, 4, 4, 40, 0, 4, 1), (128, 256, 8, 3, 0, 0, 1, 1),
         (256, 128, 8, 4, 24, 0, 1, 1), (64, 128, 4, 4, 0, 0, 8, 1), (128, 256, 8, 4, 40, 1, 2, 1),
         (128, 128, 8, 4, 40, 1, 1, 1), (64, 128, 4, 4, 0, 1, 4, 1), (128, 128, 8, 4, 40, 0, 1, 2),
         (64, 256, 4, 4, 40, 0, 1, 2), (128, 256, 8, 4, 40, 0, 1, 2, 16))
CHECKED = TILES[:16]
# Odd problems (each layout keeps those whose stored rows are 16-byte aligned: the path needs it)
ODD = ((8, 8, 8), (1, 264, 72), (129, 255, 64), (136, 264, 72), (1000, 1000, 1000), (4097, 1000, 64),
       (1000, 4104, 520), (16, 4096, 14336), (3000, 3000, 136))
FLAGS = (("fp16", "none"), ("bf16", "bias_gelu"), ("fp16", "bias_relu"))
LAYOUTS = ("nn", "nt", "tn", "tt")
# SWAP_AB (M <= 256, A row-major): (BLOCK_M, BLOCK_N, NUM_WARPS, STAGES, PRODUCER_REGS, PERSISTENT, SPLIT_K)
SWAP_TILES = ((16, 128, 4, 12, 0, 0, 1), (16, 64, 4, 8, 0, 0, 4), (32, 128, 4, 8, 0, 0, 2), (64, 128, 4, 6, 0, 0, 1),
              (16, 256, 8, 6, 40, 0, 2), (32, 256, 8, 4, 40, 1, 1), (64, 256, 8, 4, 40, 0, 1), (16, 64, 4, 8, 40, 1, 8),
              (16, 128, 8, 8, 0, 0, 8), (16, 64, 4, 4, 0, 0, 1), (32, 64, 4, 12, 0, 0, 1), (128, 64, 4, 8, 0, 0, 2),
              (128, 128, 4, 6, 0, 0, 1), (32, 64, 4, 16, 0, 0, 1))
SWAP_ODD = ((1, 264, 72), (8, 8, 8), (17, 1000, 1000), (33, 4104, 520), (64, 1000, 4104), (129, 255, 64),
            (250, 136, 3000), (16, 4096, 14336), (2, 8, 4096))
TIMED = (("4096,4096,4096", "fp16", "nn"), ("8192,8192,8192", "fp16", "nn"), ("1024,14336,4096", "bf16", "nt"),
         ("16,14336,4096", "bf16", "nt"), ("4096,4096,14336", "bf16", "nt"), ("64,4096,14336", "bf16", "nt"),
         ("1,4096,4096", "bf16", "nt"), ("128,4096,4096", "bf16", "nt"), ("32,8192,8192", "bf16", "nt"),
         ("16,4096,4096", "bf16", "nt"), ("2048,2048,2048", "fp16", "nn"), ("4096,4096,4096", "bf16", "nn"),
         ("8192,4096,4096", "bf16", "nt"))


def config(bm: int, bn: int, warps: int, stages: int, regs: int, persistent: int = 0, split: int = 1,
           cluster: int = 1, group: int = 8) -> dict:
    return dict(BASE, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps, STAGES=stages, PRODUCER_REGS=regs,
                PERSISTENT=persistent, SPLIT_K=split, CLUSTER_M=cluster, GROUP_M=group)


def short(p: dict) -> str:
    return ("{BLOCK_M}x{BLOCK_N}x{BLOCK_K} w{NUM_WARPS} s{STAGES} r{PRODUCER_REGS} g{GROUP_M} p{PERSISTENT} "
            "k{SPLIT_K} c{CLUSTER_M}").format(**p)


def accepted(limits, layouts, shapes, configs_of) -> list:
    """The (problem, config) pairs the family accepts: each of ``configs_of(shape)`` on each shape,
    layout, dtype and epilogue."""
    checks = []
    for layout in layouts:
        for dtype, epilogue in FLAGS:
            for shape in shapes:
                problem = FAMILY.parse_problem(shape, dtype, {"layout": layout, "epilogue": epilogue})
                checks += [(problem, p) for p in configs_of(shape) if FAMILY.check(p, problem, limits) is None]
    return checks


def swap_checks(limits) -> list:
    """SWAP_AB's (problem, config) pairs: every tile on each small-M odd problem, layout, dtype and
    epilogue that it accepts."""
    tiles = [dict(config(*tile), SWAP_AB=1, C_STORE="direct") for tile in SWAP_TILES]
    return accepted(limits, ("nn", "nt"), SWAP_ODD, lambda shape: tiles)


# 192 and 224 columns: (BLOCK_M, BLOCK_N, NUM_WARPS, STAGES, PRODUCER_REGS, PERSISTENT, SPLIT_K, CLUSTER_M)
WIDE_TILES = ((128, 224, 8, 4, 40, 0, 1, 1), (128, 192, 8, 4, 40, 1, 1, 1), (128, 224, 8, 4, 40, 1, 1, 2),
              (128, 192, 8, 4, 40, 0, 2, 1), (64, 224, 4, 4, 40, 0, 1, 1), (64, 192, 4, 6, 0, 0, 4, 1),
              (128, 224, 8, 3, 0, 1, 2, 1), (128, 192, 8, 4, 40, 0, 1, 2))


def wide_checks(limits) -> list:
    """The 192- and 224-column tiles' (problem, config) pairs, C from registers and (192) by TMA, on
    every odd problem, layout, dtype and epilogue that accepts them."""
    return accepted(limits, LAYOUTS, ODD, lambda shape: [
        dict(config(*tile, group=1 if shape[0] > 1000 else 8), C_STORE=c_store)
        for tile in WIDE_TILES for c_store in ("direct", "tma")])


def plan(limits, quick: bool, timings: bool = True) -> tuple[list, list]:
    """(the (problem, config) pairs to check, the (problem, candidate configs) to time)."""
    if "--swap" in sys.argv[1:]:
        return swap_checks(limits), []
    if "--wide" in sys.argv[1:]:
        return wide_checks(limits), []
    checks = accepted(limits, LAYOUTS, ODD[:5] + ODD[-1:] if quick else ODD,
                      lambda shape: [config(*tile[:8], group=1 if shape[0] > 1000 else 8) for tile in CHECKED])
    timed = []
    for shape, dtype, layout in (TIMED[:5] if quick else TIMED) if timings else ():
        problem = FAMILY.parse_problem(shape, dtype, {"layout": layout})
        timed.append((problem, [p for p in [config(*t) for t in TILES] + [config(*TILES[0], group=16)]
                                if FAMILY.check(p, problem, limits) is None]))
    return checks, timed


def main(quick: bool, timings: bool) -> None:
    from templates.family import H100_LIMITS  # the H100's and the H200's limits are the same
    from workers.compile import compile_all
    from workers.local import LocalBench
    from workers.results import CompileRequest
    from workers.peers import time_peers

    checks, timed = plan(H100_LIMITS, quick, timings)
    print(f"{len(checks)} checks, {sum(len(c) for _, c in timed)} timings planned", flush=True)
    jobs = [CompileRequest(FAMILY.render(p, q), "gemm", FAMILY.compile_options(p, q))
            for q, p in checks + [(q, p) for q, ps in timed for p in ps]]
    start = time.time()
    errors = compile_all(jobs)
    print(f"compiled {len(set(jobs))} sources in {time.time() - start:.0f} s; errors {len(errors)} {errors[:2]}",
          flush=True)
    with LocalBench() as local:
        failed = local.failures(FAMILY, checks)
        for line in failed:
            print(f"CHECK FAILED {line}", flush=True)
        print(f"checked {len(checks)} (config, problem) pairs: {len(failed)} failed", flush=True)

        rows = []
        for problem, candidates in timed:
            results = []
            for params in candidates:
                src, launch = FAMILY.render(params, problem), FAMILY.launch(params, problem)
                m = local.measure("gemm", problem, src, launch, FAMILY.compile_options(params, problem))
                if m.ok:
                    results.append((m.timing.median_ms, params, m))
                    print(f"{problem.key} {short(params)}: {m.timing.median_ms * 1e3:.1f} us "
                          f"{FAMILY.tflops(problem, m.timing.median_ms):.0f} TFLOPS regs "
                          f"{m.resources.registers if m.resources else '-'}", flush=True)
                else:
                    print(f"{problem.key} {short(params)}: {m.failure}: {m.reason}", flush=True)
            if not results:
                continue
            ms, best, _ = min(results, key=lambda r: r[0])
            bench = local.do_bench("gemm", problem, FAMILY.render(best, problem), FAMILY.launch(best, problem),
                                   FAMILY.compile_options(best, problem))
            peers = time_peers("gemm", problem)
            rows.append((problem, ms, bench, best, peers))
            print(f"{problem.key}: best {short(best)} {ms * 1e3:.1f} us; peers "
                  + ", ".join(f"{n} {r.median_ms} / {r.check_ms}" for n, r in peers.items()), flush=True)

    print("\n| problem | best config | ours us | TFLOPS | cuBLAS TFLOPS | Triton TFLOPS | vs cuBLAS | vs Triton |")
    print("|---|---|---|---|---|---|---|---|")
    for problem, ms, bench, best, peers in rows:
        cells = []
        for name in ("cublas", "triton"):
            r = peers.get(name)
            if r is None or not r.median_ms:
                cells.append(("-", "-"))
                continue
            by_bench = f"{r.check_ms / bench:.2f}x" if r.check_ms and bench else "-"
            cells.append((f"{FAMILY.tflops(problem, r.median_ms):.0f}", f"{r.median_ms / ms:.2f}x/{by_bench}"))
        print(f"| {problem.key} | {short(best)} | {ms * 1e3:.1f} | {FAMILY.tflops(problem, ms):.0f} | {cells[0][0]} "
              f"| {cells[1][0]} | {cells[0][1]} | {cells[1][1]} |")
    print("ratios: peer time / ours, held events / triton.testing.do_bench")


if __name__ == "__main__":
    main("--quick" in sys.argv[1:], "--checks-only" not in sys.argv[1:])
