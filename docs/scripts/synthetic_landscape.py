"""A landscape with every valid config of a recorded one's problem, for longer scale simulations
(docs/BENCHMARKS.md, "Scale by simulation").

    python3 docs/scripts/synthetic_landscape.py tests/data/attention_4x8x512x64-fp16-causal_h200.json \
        /tmp/attention_4x8x512x64_all.json [--seed 0]

The recorded landscape of 4x8x512x64 holds 743 configs; the family's space now has 4,744 valid ones
for that problem. At 64 simulated GPUs the recorded ones last half a second, mostly the ramp up
and the tail. Here each valid config keeps its recorded measurement where there is one, and
otherwise gets the measurement of a recorded config drawn at random (``--seed``). The GPU
times are those of the recorded trials, in the same proportions. The medians no longer belong
to their configs, so such a landscape measures the coordinator, not the search.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recorded", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from storage import params_key
    from templates import get_family
    from workers.replay import load_landscape, save_landscape

    family_name = json.loads(args.recorded.read_text())["family"]
    land = load_landscape(args.recorded, family_name)
    family = get_family(family_name)
    recorded = {params_key(p): m for p, m in land.entries}
    pool = list(recorded.values())
    draw = random.Random(args.seed)
    entries = []
    for params in family.valid_configs(land.problem, land.device.limits):
        measurement = recorded.get(params_key(params))
        entries.append((params, measurement if measurement is not None else draw.choice(pool)))
    save_landscape(args.out, device=land.device, family=family_name, problem=land.problem,
                   template_hash=land.template_hash, entries=entries)
    print(f"{args.out}: {len(entries)} configs, {sum(params_key(p) in recorded for p, _ in entries)} "
          f"as recorded, the rest drawn from the {len(pool)} recorded")


if __name__ == "__main__":
    main()
