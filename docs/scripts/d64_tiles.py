"""D=64 tiles the constraints refuse, compiled and timed anyway: do they spill, are they faster?

    python3 docs/scripts/d64_tiles.py 16,16,2048,64 fp16

FA3's D=64 forward runs 192 query rows on three consumer warpgroups with the intra-warpgroup
overlap; the family's register rule (``space.fragment_registers`` plus a reserve, against what
setmaxnreg leaves three consumers) refuses that tile. Each config below is rendered, compiled
(ptxas' spill counts printed), checked against the float64 reference and timed by the workers'
held method, beside the family's best D=64 starting point.
"""

import sys

from templates import get_family
from templates.family import H100_LIMITS
from workers.local import LocalBench

FAMILY = get_family("attention")
TMA = dict(FAMILY.default_params(), BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, STAGES=2, SMEM_LAYOUT="swizzle",
           WARP_SPECIALIZED=1, Q_IN_REGS=0, MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1, PINGPONG=1)
THREE = dict(TMA, BLOCK_M=192, NUM_WARPS=12, PINGPONG=0)
CONFIGS = [TMA, dict(THREE, INTRA_OVERLAP=0)] + [dict(THREE, BLOCK_N=n, PRODUCER_REGS=r, STAGES=s)
                                                 for n in (128, 96) for r in (24, 40) for s in (2, 3)]


def main(shape: str, dtype: str) -> None:
    problem = FAMILY.parse_problem(shape, dtype, {"causal": False})
    rows = []
    with LocalBench() as local:
        for params in CONFIGS:
            refused = FAMILY.check(params, problem, H100_LIMITS)
            m = local.measure("attention", problem, FAMILY.render(params, problem), FAMILY.launch(params, problem),
                              FAMILY.compile_options(params, problem))
            r = m.resources
            label = "{BLOCK_M}x{BLOCK_N} s{STAGES} r{PRODUCER_REGS} ov{INTRA_OVERLAP} pp{PINGPONG}".format(**params)
            spills = f"{r.spill_stores}/{r.spill_loads}" if r else "-"
            speed = f"{FAMILY.tflops(problem, m.timing.median_ms):.0f}" if m.ok else f"{m.failure}: {m.reason}"[:60]
            rows.append(f"| {label} | {'refused: ' + refused[:50] if refused else 'valid'} | {spills} | {speed} |")
            print(rows[-1], flush=True)
    print("| config | constraints | spill stores/loads | TFLOPS |\n|---|---|---|---|\n" + "\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
