"""The scheduler keeps a job's pool from one slice to its next (``SharedRun``), in this process:
real Ray, a replay standing for one GPU, SQLite."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from storage import open_repository
from storage.jobs import JobSpec
from tuner import api, lookup
from tuner.jobs.scheduler import Scheduler, SchedulerOptions

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPES = (str(ROOT / "tests" / "data"),)
FIRST = ((2, 8, 2048, 128), "fp16", {})  # tests/data/attention_2x8x2048x128-fp16_h200.json
SECOND = ((1, 8, 4096, 128), "bf16", {})  # tests/data/attention_1x8x4096x128-bf16_h200.json


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many pools were opened and closed."""
    counts = {"opened": 0, "closed": 0}
    original = api._open_pool

    class Counted:
        def __init__(self, held) -> None:
            self.held = held

        def __enter__(self):
            counts["opened"] += 1
            return self.held.__enter__()

        def __exit__(self, *exc):
            counts["closed"] += 1
            return self.held.__exit__(*exc)

    monkeypatch.setattr(api, "_open_pool", lambda fam, problem, where: Counted(original(fam, problem, where)))
    return counts


def _run(url: str, *specs: JobSpec) -> list:
    repo = open_repository(url)
    try:
        ids = [repo.submit_job(spec) for spec in specs]
        stop = threading.Event()
        scheduler = Scheduler(url, SchedulerOptions(replay=LANDSCAPES, slice_trials=3, poll_s=0.2))

        def until_done() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if all(job.state not in ("queued", "running") for job in repo.jobs() if job.id in ids):
                    break
                time.sleep(0.3)
            stop.set()

        watcher = threading.Thread(target=until_done, daemon=True)
        watcher.start()
        with api.quiet_optuna(), api.ray_for(None, LANDSCAPES[0], family=lookup.family("attention")):
            scheduler.run(stop)
        watcher.join()
        return [repo.job(job_id) for job_id in ids]
    finally:
        repo.close()


def test_a_jobs_slices_run_on_one_pool_and_it_is_closed_when_the_job_ends(tmp_path, counted, module_ray):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    (job,) = _run(url, JobSpec("attention", [FIRST, SECOND], trials=6))
    assert job.state == "done", job
    assert [p.measured for p in job.problems] == [6, 6]
    # four slices (two problems, two slices each) on the pool of the first
    assert counted == {"opened": 1, "closed": 1}


def test_slices_of_jobs_in_turn_close_the_pool_kept_for_the_other(tmp_path, counted, module_ray):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    jobs = _run(url, JobSpec("attention", [FIRST], trials=6), JobSpec("attention", [SECOND], trials=6))
    assert [job.state for job in jobs] == ["done", "done"]
    assert all(job.problems[0].measured == 6 for job in jobs)
    # one GPU, two jobs of equal priority in turn: each slice closes the pool kept for the other
    assert counted["opened"] == counted["closed"] >= 2
