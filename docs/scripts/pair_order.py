"""Does a config's ratio to the anchor depend on what else the GPU runs at its power cap?

    PYTHONPATH=<checkout> python3 docs/scripts/pair_order.py SPEC.json [--repeats 3]

SPEC: drift_check.py's spec (shape, dtype, causal, configs, the anchor last). On GPU 0: each
picked config timed beside the anchor (``GpuBench.measure(anchor=...)``: T A T A), ``--repeats``
times; then the picked configs and the anchor re-timed interleaved all together
(``GpuBench.retime``, whose rounds' time the slowest configs dominate). Prints each config's ratio
to the anchor both ways.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pick", default="0,1,2,3,11,15,19")
    args = parser.parse_args()
    from multigpu_check import _compiled
    from workers.gpu import GpuBench

    spec = json.loads(args.spec.read_text())
    _, problem, kernels = _compiled(spec)
    bench = GpuBench(0)
    anchor = kernels[-1]
    picked = [int(i) for i in args.pick.split(",")]
    bench.retime(kernels, "attention", problem, rounds=10, max_seconds=30)  # to the power cap
    rows = {i: {"paired": [], "anchor_ms": []} for i in picked}
    for _ in range(args.repeats):
        for i in picked:
            m = bench.measure(*kernels[i], "attention", problem, anchor=anchor)
            assert m.ok and m.paired is not None, m.reason
            rows[i]["paired"].append(m.paired.ratio)
            rows[i]["anchor_ms"].append(m.paired.anchor_ms)
    turns = bench.retime([kernels[i] for i in picked] + [anchor], "attention", problem, rounds=30, max_seconds=60)
    a = turns.measurements[-1].timing.median_ms
    print("| config | beside the anchor | re-timed among all | difference | anchor ms beside |")
    print("|---|---|---|---|---|")
    out = []
    for k, i in enumerate(picked):
        again = turns.measurements[k].timing.median_ms / a
        paired = statistics.median(rows[i]["paired"])
        out.append({"config": i, "paired": rows[i]["paired"], "retimed": again})
        print(f"| {i} | {paired:.4f} | {again:.4f} | {100 * (paired / again - 1):+.2f}% | "
              f"{statistics.median(rows[i]['anchor_ms']):.4f} |")
    print("PAIRS " + json.dumps(out))
    bench.close()


if __name__ == "__main__":
    main()
