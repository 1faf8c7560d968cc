"""Each Hopper technique's worth, measured: the fastest TMA-path starting point of a problem, then
the same config with one technique turned off at a time, all timed in one process by the
workers' held method (and cuDNN beside them, the same way).

    python3 docs/scripts/ablation.py "4,16,4096,128;1,32,8192,128;8,16,2048,128;16,16,2048,64" fp16 [--causal]

Variants: TMA -> cp.async (the cp.async wgmma path's best starting point: the loads of the compute
warps, no producer warpgroup), then each technique toggled on its own: setmaxnreg (PRODUCER_REGS
0 or 24), ping-pong, intra-warpgroup overlap: turned off where the winner uses it, on where it
does not. Where the winner's tile does not fit with the
change (without setmaxnreg the consumers have fewer registers), the largest BLOCK_N that does is
timed, and the row says so.
"""

from __future__ import annotations

import sys

from templates import get_family
from workers.local import LocalBench
from workers.peers import time_peers

FAMILY = get_family("attention")
# (technique, parameter, its value when off, a value when on)
TOGGLES = (("setmaxnreg", "PRODUCER_REGS", 0, 24), ("ping-pong", "PINGPONG", 0, 1),
           ("intra-warpgroup overlap", "INTRA_OVERLAP", 0, 1))


def short(params) -> str:
    """128x176 s2 r24 ov1 pp1 st16 persistent (the TMA path), or 128x128 s3 wgmma cp.async."""
    if params["LOADS"] != "tma":
        return "{BLOCK_M}x{BLOCK_N} s{STAGES} {MMA} cp.async".format(**params)
    text = "{BLOCK_M}x{BLOCK_N} s{STAGES} r{PRODUCER_REGS} ov{INTRA_OVERLAP} pp{PINGPONG} {EPILOGUE} {SCHEDULE}"
    return text.format(**params) + (" lpt" if params["TILE_ORDER"] == "lpt" else "")


def measure(local: LocalBench, problem, params):
    launch = FAMILY.launch(params, problem)
    return local.measure("attention", problem, FAMILY.render(params, problem), launch,
                         FAMILY.compile_options(params, problem))


def nearest_valid(params, problem, limits):
    """``params``, or with the largest BLOCK_N below its own that the constraints accept (without
    setmaxnreg, say, the winner's tile may not fit the consumers' registers); None if none does."""
    if FAMILY.check(params, problem, limits) is None:
        return params
    smaller = sorted((n for n in next(p.choices for p in FAMILY.params if p.name == "BLOCK_N")
                      if n < params["BLOCK_N"]), reverse=True)
    return next((dict(params, BLOCK_N=n) for n in smaller
                 if FAMILY.check(dict(params, BLOCK_N=n), problem, limits) is None), None)


def main(shapes: str, dtype: str, causal: bool) -> None:
    rows = []
    with LocalBench() as local:
        limits = local.device.limits
        for shape in shapes.split(";"):
            problem = FAMILY.parse_problem(shape, dtype, {"causal": causal})
            starts = FAMILY.starting_points(problem, limits)
            timed = [(p, measure(local, problem, p)) for p in starts]
            ok = [(p, m) for p, m in timed if m.ok]
            tma = [(p, m) for p, m in ok if p["LOADS"] == "tma"]
            cpasync = [(p, m) for p, m in ok if p["LOADS"] == "cp.async"]
            best, best_m = min(tma, key=lambda pm: pm[1].timing.median_ms)
            variants = [("winner (TMA path)", best, best_m)]
            if cpasync:
                p, m = min(cpasync, key=lambda pm: pm[1].timing.median_ms)
                variants.append(("TMA -> cp.async", p, m))
            for technique, param, off, on in TOGGLES:
                value = off if best[param] != off else on
                name, change = f"{'no' if value == off else 'with'} {technique} ({param}={value})", {param: value}
                params = nearest_valid(dict(best, **change), problem, limits)
                if params is None:
                    variants.append((name, dict(best, **change), "no BLOCK_N passes the constraints"))
                elif params != best:
                    if params["BLOCK_N"] != best["BLOCK_N"]:
                        name += f" (BLOCK_N {params['BLOCK_N']}: {best['BLOCK_N']} does not fit)"
                    variants.append((name, params, measure(local, problem, params)))
            cudnn = time_peers("attention", problem, cross_check=False).get("cudnn")
            for name, params, m in variants:
                if isinstance(m, str):
                    rows.append((problem.key, name, short(params), None, m))
                elif not m.ok:
                    rows.append((problem.key, name, short(params), None, f"{m.failure}: {m.reason}"))
                else:
                    rows.append((problem.key, name, short(params), FAMILY.tflops(problem, m.timing.median_ms), ""))
            if cudnn and cudnn.median_ms:
                rows.append((problem.key, "cuDNN", "", FAMILY.tflops(problem, cudnn.median_ms), ""))
            print(f"{problem.key}: winner {best}", flush=True)
    print("| problem | variant | config | TFLOPS | vs winner | note |")
    print("|---|---|---|---|---|---|")
    top = {}
    for key, name, config, tflops, note in rows:
        top.setdefault(key, tflops)
        share = f"{tflops / top[key]:.2f}x" if tflops and top[key] else "-"
        print(f"| {key} | {name} | {config} | {f'{tflops:.0f}' if tflops else '-'} | {share} | {note} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--causal" in sys.argv[3:])
