"""What a claim and a store of 100 trials cost as a study grows to tens of thousands of trials, on
a fresh PostgreSQL database (docs/BENCHMARKS.md, "Scale by simulation", 2026-11-27, commit
d52a7f7). The simulation's studies end at 4,744 trials (every valid config of its problem); this
goes past them through the storage layer alone.

    python3 docs/scripts/claim_growth.py [--trials 40000] [--older 0] [--no-analyze]
        [--db postgresql|sqlite] [--pg postgresql://postgres@127.0.0.1:5432/test]

``--older N``: the database first holds an older study of N trials (inserted in one statement,
then analyzed), as a long-lived database does. ``--no-analyze``: the claims never analyze the
trial tables (``storage.batches.ANALYZE_FROM`` out of reach), as before commit d52a7f7.
Prints the mean claim and store of each stretch, ending at 1,000, 4,000, 10,000, 20,000 and 40,000.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from db_batch_cost import DEVICE, outcome  # noqa: E402
from scale_sim import fresh_database  # noqa: E402

BATCH = 100
MARKS = (1_000, 4_000, 10_000, 20_000, 40_000, 80_000, 160_000)


def _older(repo, trials: int) -> None:
    """An analyzed study of ``trials`` ok trials, inserted by the server."""
    study = repo.open_study("older", family="attention", template_hash="-", space={}, shape=[1], dtype="fp16",
                            flags={}, device=DEVICE, sampler="tpe", replay=True, settings={})
    with repo.engine.connect() as connection:
        connection.exec_driver_sql(
            "INSERT INTO tuner_trials (study_id, number, params, config_key, status, detail, median_ms, replayed, "
            f"created_at) SELECT {study.id}, g, ('{{\"A\": ' || g || '}}')::json, md5(g::text) || md5(g::text), "
            f"'ok', '', 0.1, true, now() FROM generate_series(0, {trials - 1}) g")
        connection.exec_driver_sql("ANALYZE tuner_trials, tuner_running_trials")
        connection.commit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40_000)
    parser.add_argument("--older", type=int, default=0)
    parser.add_argument("--no-analyze", action="store_true")
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    import storage
    from storage import batches

    if args.no_analyze:
        batches.ANALYZE_FROM = 10**15
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = fresh_database(args.db, args.pg, Path(tmp))
        repo = storage.open_repository(url)
        try:
            if args.older:
                _older(repo, args.older)
            study = repo.open_study("growing", family="attention", template_hash="-", space={}, shape=[1],
                                    dtype="fp16", flags={}, device=DEVICE, sampler="tpe", replay=True, settings={})
            outcomes = [outcome(i) for i in range(BATCH)]
            claim = store = 0.0
            batches_done = 0
            for first in range(0, args.trials, BATCH):
                configs = [{"A": first + i, "B": 64, "C": "x"} for i in range(BATCH)]
                began = time.perf_counter()
                numbers = repo.claim_trials(study.id, configs, owner="h:1")
                claimed = time.perf_counter()
                repo.record_trials(study.id, list(zip(numbers, configs, outcomes)), owner="h:1")
                claim += claimed - began
                store += time.perf_counter() - claimed
                batches_done += 1
                if first + BATCH in MARKS:
                    print(f"{args.db}, older {args.older}, analyze {'off' if args.no_analyze else 'on'}: at "
                          f"{first + BATCH:,} trials, claim {claim / batches_done * 1e3:.1f} ms, store "
                          f"{store / batches_done * 1e3:.1f} ms a batch of {BATCH} (mean of the last "
                          f"{batches_done})", flush=True)
                    claim = store = 0.0
                    batches_done = 0
        finally:
            repo.close()
            drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
