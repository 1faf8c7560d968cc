"""What ``Repository.claim_trials`` and ``record_trials`` cost, a transaction and a row, on
PostgreSQL and SQLite (docs/BENCHMARKS.md, "Scale by simulation", 2026-11-27).

    python3 docs/scripts/db_batch_cost.py [--profile] [--pg postgresql://postgres@127.0.0.1:5432/test]

A fresh database each (a PostgreSQL database made for the run and dropped, a SQLite file in a
temporary folder), one study, then ten rounds each of 1, 8, 32 and 64 configs claimed and then
stored as ok results. ``--profile``: cProfile's top functions for the batches of 32.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_sim import fresh_database  # noqa: E402

DEVICE = {"name": "H100", "sm_count": 132, "compute_capability": "9.0", "driver_version": "-",
          "cuda_version": "13.0"}
ROUNDS = 10


def outcome(i: int):
    from storage import TrialOutcome

    return TrialOutcome(status="ok", median_ms=0.02 + 0.001 * i, min_ms=0.02, max_ms=0.03, iqr_ms=0.001,
                        repetitions=200, registers=128, cubin_hash="ab" * 32, toolkit="nvrtc 13.0",
                        replayed=True, gpu_state={"name": "H100", "before": {"sm": 1980}, "after": {"sm": 1980}})


def measure(url: str, profile: bool) -> None:
    import storage

    repo = storage.open_repository(url)
    study = repo.open_study("cost", family="attention", template_hash="-", space={}, shape=[1], dtype="fp16",
                            flags={}, device=DEVICE, sampler="tpe", replay=True, settings={})
    n = 0
    for batch in (1, 8, 32, 64):
        claim = store = 0.0
        profiler = cProfile.Profile() if profile and batch == 32 else None
        for _ in range(ROUNDS):
            configs = [{"A": n + i, "B": 64, "C": "x", "D": 2, "E": True, "F": 128, "G": 4} for i in range(batch)]
            n += batch
            if profiler is not None:
                profiler.enable()
            began = time.perf_counter()
            numbers = repo.claim_trials(study.id, configs, owner="host:1", limit=None)
            claimed = time.perf_counter()
            repo.record_trials(study.id, [(number, config, outcome(i)) for i, (number, config)
                                          in enumerate(zip(numbers, configs))], owner="host:1")
            store += time.perf_counter() - claimed
            claim += claimed - began
            if profiler is not None:
                profiler.disable()
        rows = ROUNDS * batch
        print(f"{url.split(':')[0]} batch {batch}: claim {claim / ROUNDS * 1e3:.1f} ms a transaction, "
              f"{claim / rows * 1e3:.2f} ms a row; store {store / ROUNDS * 1e3:.1f} ms a transaction, "
              f"{store / rows * 1e3:.2f} ms a row", flush=True)
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
            print(out.getvalue())
    repo.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("postgresql", "sqlite"):
            url, drop = fresh_database(kind, args.pg, Path(tmp))
            try:
                measure(url, args.profile)
            finally:
                drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
