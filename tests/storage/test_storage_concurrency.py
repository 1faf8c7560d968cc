"""Several processes on one database: opening a new one together, recording trials together."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from storage import TrialOutcome, open_repository


def test_opening_a_new_database_together(url):
    def open_and_close(_: int) -> bool:
        open_repository(url).close()
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(open_and_close, range(4)))
    with open_repository(url) as repo:
        assert repo.studies() == []


def test_writers_of_one_problem_keep_one_consistent_best(url, study_args):
    with open_repository(url) as repo:
        ids = [repo.open_study(f"s{i}", **study_args()).id for i in range(4)]

    def write(index: int) -> None:
        with open_repository(url) as repo:  # one repository per writer, like one per process
            for number in range(10):
                median = 1.0 + ((number * 7 + index * 3) % 17) / 10
                repo.record_trial(ids[index], number, {"n": number}, TrialOutcome(status="ok", median_ms=median))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))
    with open_repository(url) as repo:
        trials = [t for study_id in ids for t in repo.trials(study_id)]
        assert len(trials) == 40
        best = repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
        assert best.median_ms == min(t.median_ms for t in trials)


def test_a_sqlite_writer_waits_out_another_process_holding_the_write_lock(tmp_path, study_args):
    """Another process holds SQLite's write lock for 6 s (longer than the 5 s a writer used to
    wait): the write waits for it and succeeds; no "database is locked" reaches the caller."""
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    with open_repository(url) as repo:
        study = repo.open_study("s", **study_args())
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(tmp_path / 'tuner.db')!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(6); c.execute('COMMIT')\n"
    )], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with open_repository(url) as repo:
        repo.record_trial(study.id, 0, {"n": 0}, TrialOutcome(status="ok", median_ms=1.0))
        assert len(repo.trials(study.id)) == 1
    assert time.monotonic() - started > 4 and holder.wait(10) == 0
