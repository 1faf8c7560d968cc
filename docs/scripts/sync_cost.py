"""What a coordinator's sync costs as its study grows: ``MirroredStudy.sync`` when
the memory holds every stored trial but the last 10, another coordinator's.

    python3 docs/scripts/sync_cost.py [--trials 1000 4000 16000] [--pg postgresql://postgres@127.0.0.1:5432/test]

A fresh database each (a PostgreSQL database made for the run and dropped, a SQLite file), one
study, its trials stored by ``Repository.record_trials`` in batches of 100; then the median of
five syncs (each after 10 more trials stored by another owner).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from db_batch_cost import DEVICE, outcome  # noqa: E402
from scale_sim import fresh_database  # noqa: E402


def measure(url: str, trials: int) -> float:
    import storage
    from templates.family import Param
    from tuner.study import search
    from tuner.study.mirror import MirroredStudy

    space = search.SearchSpace(tuple(Param(name, tuple(range(10))) for name in "ABCDE"))  # 100,000 configs
    repo = storage.open_repository(url)
    study = repo.open_study("sync", family="toy", template_hash="-", space={}, shape=[1], dtype="fp16",
                            flags={}, device=DEVICE, sampler="random", replay=True, settings={})
    made = iter(range(100_000))

    def store(count: int, owner: str) -> None:
        configs = [{name: int(digit) for name, digit in zip("ABCDE", f"{next(made):05d}")} for _ in range(count)]
        numbers = repo.claim_trials(study.id, configs, owner=owner)
        repo.record_trials(study.id, [(n, c, outcome(i)) for i, (n, c) in enumerate(zip(numbers, configs))],
                           owner=owner)

    for start in range(0, trials, 100):
        store(min(100, trials - start), "here:1")
    mirror = MirroredStudy(repo, study.id, space, search.make_sampler("random", space, seed=0))
    mirror.sync(force=True)  # the memory holds them all
    times = []
    for _ in range(5):
        store(10, "elsewhere:2")
        began = time.perf_counter()
        synced = mirror.sync(force=True)
        times.append(time.perf_counter() - began)
        assert len(synced.finished) == 10
    repo.close()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    print("| db | stored trials | sync ms (median of 5) |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("postgresql", "sqlite"):
            for trials in args.trials:
                url, drop = fresh_database(kind, args.pg, Path(tmp))
                try:
                    print(f"| {kind} | {trials} | {1e3 * measure(url, trials):.1f} |", flush=True)
                finally:
                    drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
