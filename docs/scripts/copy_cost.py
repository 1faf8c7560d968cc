"""What the optuna-dashboard copy costs a study on SQLite: the coordinator's time in its claims
and stores (and the longest one), and the study's wall, with simulated GPUs (no GPU needed).

    TUNER_OPTUNA_COPY=1 PYTHONPATH=<checkout> python3 docs/scripts/copy_cost.py [GPUS] [TRIALS] [DIR]
    TUNER_OPTUNA_COPY=0 ...                                               # the same without the copy

The study: attention 2x8x2048x128 fp16, TPE, seed 0, replayed from its recorded landscape on
GPUS simulated GPUs (default 2), TRIALS trials (default 200), a new database in DIR (default a
temporary folder). Prints one line, ``COPY {...}``, seconds.
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import tuner
import tuner.study.loop as loop_module
from call_time import summed

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPE = ROOT / "tests" / "data" / "attention_2x8x2048x128-fp16_h200.json"
totals: dict[str, float] = {}


def main() -> None:
    gpus = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    folder = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(tempfile.mkdtemp(prefix="copy-cost-"))
    mirror = loop_module.MirroredStudy
    mirror.record_many = summed(totals, "claims", mirror.record_many, longest=True)
    mirror.finish_many = summed(totals, "stores", mirror.finish_many, longest=True)
    db = folder / f"copy{os.environ.get('TUNER_OPTUNA_COPY', '1')}-{os.getpid()}.db"
    began = time.monotonic()
    result = tuner.tune("attention", "2,8,2048,128", "fp16", {"causal": False}, trials=trials,
                        db=f"sqlite:///{db}", seed=0, replay=str(LANDSCAPE), simulate_gpus=gpus, sampler="tpe")
    print("COPY " + json.dumps({
        "copy": os.environ.get("TUNER_OPTUNA_COPY", "1"), "gpus": gpus, "measured": result.measured,
        "elapsed": round(result.elapsed_s, 2), "call": round(time.monotonic() - began, 2),
        "busy": [round(share, 3) for share in result.throughput.busy],
        **{k: round(v, 3) for k, v in sorted(totals.items())}}), flush=True)


if __name__ == "__main__":
    main()
