"""The coordinator's CPU a trial when it calls one actor a trial, as it calls real GPUs
(docs/BENCHMARKS.md, "Scale by simulation", 2026-11-27, commit 4569029).

    python3 docs/scripts/real_dispatch.py [--gpus 8] [--trials 2000] [--db sqlite:///...]

``tuner.tune`` on the 4x8x512x64 attention landscape of every valid config
(docs/scripts/synthetic_landscape.py makes it: /tmp/attention_4x8x512x64-all.json) with N replay
actors (``WorkerPool(replay_gpus=...)``): each stands for a GPU and is called once a trial
through the pool's real dispatch, but answers at once (no GPU time, no compiles). So the study
runs as fast as its coordinator does: trials a second is the coordinator's limit on this path,
and its CPU a trial what each trial costs it. the default sampler (``tpe``), seed 1, no warm start or re-timing;
a fresh SQLite file unless ``--db``. The actors are called through a node agent
(``workers.agent``: one call a poll), as every pool calls them. Prints one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--landscape", default="/tmp/attention_4x8x512x64-all.json")
    parser.add_argument("--db")
    args = parser.parse_args()

    import tuner
    import tuner.api as api

    opened = api._open_pool

    def with_replay_gpus(fam, problem, **options):  # the seam the tests use for their pools
        return opened(fam, problem, **options, replay_gpus=[1.0] * args.gpus)

    api._open_pool = with_replay_gpus
    with tempfile.TemporaryDirectory() as tmp:
        result = tuner.tune("attention", "4,8,512,64", "fp16", {"causal": True}, trials=args.trials,
                            replay=args.landscape, db=args.db or f"sqlite:///{tmp}/tuner.db", seed=1,
                            retime=0, warm_start=0)
    shown = result.throughput.to_json()
    print(json.dumps({"gpus": args.gpus, **{k: shown.get(k) for k in (
        "measured", "wall_s", "trials_per_s", "cpu_ms_per_trial", "db_ms_per_trial")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
