"""The coordinator end to end: real Optuna, real storage (a SQLite file; PostgreSQL too where a
test takes ``url``), a fake pool."""

from __future__ import annotations

from collections import Counter

import pytest

import tuner
from storage import open_repository, params_key
from tuner_doubles import (
    GPU_FAILURES,
    PROBLEM,
    DEVICE,
    FakeClock,
    FakePool,
    clocks_of,
    failure_of,
    latency_ms,
    valid_configs,
)
from tuner import api
from tuner.study import loop, search
from tuner.study.options import LoopOptions, StudyOptions


def _tune(**kwargs):
    options = {"sampler": "tpe", "seed": 0}
    options.update(kwargs)
    return tuner.tune("toy", *PROBLEM, **options)


def counting(method, calls):
    """``method``, noting each call's result in ``calls``."""
    def counted(self, *args, **kwargs):
        calls.append(result := method(self, *args, **kwargs))
        return result
    return counted


def _study(db, name):
    return next(s for s in open_repository(db).studies() if s.name == name)


def _running(db, name):
    return open_repository(db).running(_study(db, name).id)


def test_trial_budget_records_every_measured_trial(toy, db, pools):
    result = _tune(trials=20, db=db)
    pool = pools.used[0]
    assert result.status == "finished" and result.reason == "20 trials measured"
    assert result.measured == 20 == len(pool.submitted)
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    assert study.status == "finished"
    stored = repo.trials(study.id)
    assert len(stored) == 20
    for trial in stored:
        assert (trial.status == "ok") == (failure_of(trial.params) is None)
        if trial.status == "ok":
            assert trial.median_ms == pytest.approx(latency_ms(trial.params))
            flops = toy.flops(toy.parse_problem(*PROBLEM))
            assert trial.tflops == pytest.approx(flops / (trial.median_ms / 1e3) / 1e12)
            assert trial.registers == 96 and trial.repetitions == 50
            assert trial.gpu_state == clocks_of(trial.params) != dict(DEVICE.clocks)
            assert not trial.replayed and trial.toolkit == "nvcc 13.0.88"
        else:
            assert trial.gpu_state is None  # no clocks are read for a failure
    assert len({t.number for t in stored}) == 20 and _running(db, result.study) == []


def test_the_pool_is_served_between_asks(toy, db, pools, monkeypatch):
    monkeypatch.setattr(loop, "SERVE_EVERY_S", 0.0)
    _tune(trials=20, db=db, sampler="optuna-tpe")
    calls = pools.used[0].calls
    lookahead = loop.default_lookahead(pools.used[0])
    # the first fill asks `lookahead` configs before the first poll, serving the pool after each
    assert calls.index("poll") >= lookahead and set(calls[:calls.index("poll")]) == {"serve"}
    assert calls.count("serve") >= 20


def test_the_pool_is_served_after_each_batch(toy, db, pools, monkeypatch):
    monkeypatch.setattr(loop, "SERVE_EVERY_S", 0.0)
    monkeypatch.setattr(loop.Coordinator, "_propose", counting(loop.Coordinator._propose, proposed := []))
    _tune(trials=20, db=db, warm_start=0)
    calls = pools.used[0].calls
    # the default proposes a batch at once: the pool is served after each, before any poll too
    assert proposed and calls[0] == "serve" and calls.count("serve") >= len(proposed)


def test_a_study_asks_its_last_trials_while_others_are_in_flight(toy, db, pools):
    # a lookahead of 34 (32 compile workers, 2 on the GPU): while trials are in flight, a batch
    # waits for 4 free slots (an eighth), but not past what the study lacks: the last 2 of 40
    # were asked only once every trial in flight had come back, while the GPUs idled
    pool = FakePool(per_poll=1)
    pool.compile_workers = 32
    pools.queued.append(pool)
    result = _tune(trials=40, db=db, sampler="random")
    assert result.measured == 40 == len(pool.submitted)
    lookahead = loop.default_lookahead(pool)
    assert lookahead == 34 and min(pool.in_flight_at_submit[-5:]) >= lookahead - lookahead // 8


def test_invalid_configs_are_told_without_compiling_and_do_not_count(toy, db, pools, monkeypatch):
    # the samplers propose among the family's listed valid configs: a family that lists more
    # than its check accepts gets the rest rejected
    monkeypatch.setattr(type(toy), "valid_configs", lambda self, problem, device: list(self.configs()))
    result = _tune(trials=15, db=db, sampler="random")
    pool = pools.used[0]
    problem = toy.parse_problem(*PROBLEM)
    assert all(toy.check(p, problem, pool.limits) is None for p in pool.submitted)
    assert result.invalid > 0 and result.measured == 15
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    stored = repo.trials(study.id)  # storage holds measured trials only: the sampler was told
    assert len(stored) == 15  # the rejected ones in memory
    assert sorted(t.key for t in stored) == sorted(params_key(p) for p in pool.submitted)


def test_failures_are_stored_with_their_kind_and_never_become_best(toy, db, tuned):
    result = tuned.result
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    failed = [t for t in repo.trials(study.id) if t.status == "failed"]
    assert {t.failure for t in failed} == set(GPU_FAILURES)
    assert all(t.failure == failure_of(t.params) and t.reason for t in failed)
    assert all(t.tflops is None for t in failed)
    ok = [t for t in repo.trials(study.id) if t.status == "ok"]
    fastest = min(ok, key=lambda t: t.median_ms)
    assert min(latency_ms(t.params) for t in failed) < fastest.median_ms  # failures were faster
    assert result.best.params == fastest.params and result.best.median_ms == fastest.median_ms
    assert failure_of(tuner.best("toy", *PROBLEM, db=db).params) is None


def test_grid_covers_the_valid_space_once_and_stops(toy, db, tuned):
    result, submitted = tuned.result, tuned.pool.submitted
    expected = {params_key(c) for c in valid_configs(toy)}
    assert Counter(params_key(p) for p in submitted) == Counter(expected)  # each exactly once
    assert result.reason == f"every valid config ({len(expected)}) measured"
    assert result.invalid == 0  # the grid walks the valid configs alone


def test_tpe_proposes_new_configs_before_repeats(toy, db, pools):
    n_valid = len(valid_configs(toy))
    result = _tune(trials=n_valid // 2, db=db)
    assert result.measured == n_valid // 2 and result.reused == 0


def test_duplicates_are_never_measured_again(toy, db, pools):
    # Random search over a small space repeats itself: repeats are answered without the GPU.
    n_valid = len(valid_configs(toy))
    result = _tune(trials=n_valid // 2, db=db, sampler="random")
    submitted = pools.used[0].submitted
    keys = [params_key(p) for p in submitted]
    assert len(keys) == len(set(keys)) == n_valid // 2
    assert result.reused > 0
    stored = open_repository(db).trials(_study(db, result.study).id)
    assert sorted(t.key for t in stored) == sorted(keys)  # one record of each measured config


def test_rerun_of_a_finished_study_measures_nothing(toy, db, pools):
    first = _tune(trials=12, db=db)
    second = _tune(trials=12, db=db)
    assert second.study == first.study
    assert second.previous == 12 and second.measured == 0
    assert pools.used[1].submitted == []


def test_time_budget_stops_asking(toy, db):
    clock = FakeClock()
    pool = FakePool(per_poll=1, seconds_per_result=1.0, clock=clock)
    fam = toy
    problem = fam.parse_problem(*PROBLEM)
    with open_repository(db) as repo:
        name, outcome, _ = api._run_study(
            fam, problem, pool, repo, db, space=search.SearchSpace(fam.params),
            options=StudyOptions(sampler="random", seed=1, time_budget=10.0),
            loop=LoopOptions(clock=clock, lookahead=3),
        )
    assert outcome.status == "finished" and outcome.reason == "time budget of 10s spent"
    assert 10 <= outcome.measured <= 10 + 3
    assert outcome.measured < len(valid_configs(toy))


def test_interrupt_then_resume_continues_the_same_study(toy, db, pools):
    pools.queued.append(FakePool(per_poll=1, interrupt_after_polls=5))
    first = _tune(trials=25, db=db)
    assert first.status == "interrupted" and 0 < first.measured < 25
    repo = open_repository(db)
    assert next(s for s in repo.studies() if s.name == first.study).status == "interrupted"
    left = _running(db, first.study)
    assert left and all(r.owner is None for r in left)  # what was in flight: left to the next run

    second = _tune(trials=25, db=db)
    assert second.study == first.study and second.status == "finished"
    assert second.previous == first.measured and first.measured + second.measured == 25
    first_keys = {params_key(p) for p in pools.used[0].submitted[: first.measured]}
    second_keys = [params_key(p) for p in pools.used[1].submitted]
    assert not first_keys & set(second_keys)
    requeued = {r.key for r in left}
    assert requeued <= set(second_keys[: len(requeued)])  # measured first
    assert next(s for s in repo.studies() if s.name == first.study).status == "finished"
    assert _running(db, first.study) == []
    numbers = [t.number for t in repo.trials(_study(db, first.study).id)]
    assert len(numbers) == len(set(numbers)) == 25


def test_resume_after_a_kill_settles_running_trials(toy, db, pools):
    first = _tune(trials=5, db=db)
    # A killed run leaves trials running: one whose config was measured since, one never measured.
    repo = open_repository(db)
    record = _study(db, first.study)
    stored = [t for t in repo.trials(record.id) if t.status == "ok"][0]
    done = {params_key(t.params) for t in repo.trials(record.id)}
    fresh = next(c for c in valid_configs(toy) if params_key(c) not in done)
    killed = f"{__import__('socket').gethostname()}:{_dead_pid()}"
    repo.claim_trial(record.id, fresh, owner=killed)
    # a config measured since (its lease lost, or left by an older version): written directly,
    # since claim_trial refuses a measured config
    from storage.models import RunningTrial
    from storage.records import config_key

    with repo._session("test", write=True) as session:
        session.add(RunningTrial(study_id=record.id, number=99, params=stored.params,
                                 config_key=config_key(stored.params), owner=killed))
    assert len(_running(db, first.study)) == 2

    second = _tune(trials=8, db=db)
    assert _running(db, first.study) == []
    trials = repo.trials(record.id)
    assert [t.key for t in trials].count(stored.key) == 1  # not measured again
    assert params_key(pools.used[1].submitted[0]) == params_key(fresh)
    assert second.previous == 5 and second.measured == 3 and len(trials) == 8


def test_many_asks_without_a_new_config_stop_the_study(toy, db):
    pool = FakePool(per_poll=1)
    problem = toy.parse_problem(*PROBLEM)
    with open_repository(db) as repo:
        _, outcome, _ = api._run_study(
            toy, problem, pool, repo, db, space=search.SearchSpace(toy.params),
            options=StudyOptions(sampler="random", seed=3), loop=LoopOptions(max_idle_asks=3, lookahead=1),
        )
    assert outcome.reason == "3 asks in a row brought no new config"
    assert outcome.measured == len(pool.submitted) < len(valid_configs(toy))


def test_replayed_studies_are_kept_apart(toy, db, pools):
    real = _tune(trials=3, db=db)
    replayed = _tune(trials=3, db=db, replay="landscape.json")
    assert replayed.study == real.study + "/replay" and replayed.previous == 0
    summaries = {s.name: s for s in open_repository(db).studies()}
    assert summaries[replayed.study].replay and not summaries[real.study].replay


def test_the_early_stop_bar_follows_the_best_so_far(toy, db, pools):
    bars = []

    class BarPool(FakePool):
        def set_abort_above(self, ms):
            bars.append(ms)

    pools.queued.append(BarPool())
    result = tuner.tune("toy", *PROBLEM, trials=15, db=db, seed=0)
    assert bars and all(a >= b for a, b in zip(bars, bars[1:]))  # only ever lowered
    assert bars[-1] == pytest.approx(1.5 * result.best.median_ms)

    pools.queued.append(BarPool())
    bars.clear()
    full = tuner.tune("toy", "2,4,4096,64", "fp16", trials=8, db=db, seed=0, early_stop=False)
    assert full.measured == 8 and bars == []  # every candidate timed in full


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("owner_is_running", [True, False])
def test_a_trial_of_a_running_coordinator_is_left_to_it(toy, db, pools, owner_is_running):
    """Several machines may share one study: a RUNNING trial whose coordinator still runs is
    not re-queued by another; one whose coordinator is gone is."""
    import os
    import socket

    first = _tune(trials=3, db=db)
    done = {params_key(t.params) for t in tuner.show(first.study, db=db).trials}
    fresh = next(c for c in valid_configs(toy) if params_key(c) not in done)
    import threading
    import time

    from storage import TrialOutcome

    pid = os.getppid() if owner_is_running else _dead_pid()
    owner = f"{socket.gethostname()}:{pid}"
    repo = open_repository(db)
    study_id = _study(db, first.study).id
    number = repo.claim_trial(study_id, fresh, owner=owner)

    def other_coordinator() -> None:  # measures its trial in 3 s, renewing its lease meanwhile
        for _ in range(6):
            time.sleep(0.5)
            repo.renew_leases(study_id, owner)
        repo.record_trial(study_id, number, fresh, TrialOutcome(status="ok", median_ms=9.0), owner=owner)

    other = threading.Thread(target=other_coordinator)
    if owner_is_running:
        other.start()
    second = _tune(trials=5, db=db)
    submitted = [params_key(p) for p in pools.used[-1].submitted]
    trials = tuner.show(first.study, db=db).trials
    assert _running(db, first.study) == [] and len(trials) == 5
    if owner_is_running:  # left to it, waited for: the two stop together at the study's 5 trials
        other.join()
        assert params_key(fresh) not in submitted and second.measured == 1
        assert [params_key(t.params) for t in trials].count(params_key(fresh)) == 1
    else:
        assert submitted[0] == params_key(fresh) and second.measured == 2


def test_a_killed_study_resumes_on_each_backend(toy, url, pools):
    """Interrupted with trials in flight, then killed with one more left running: the same
    command continues the study, measuring what was left first and nothing twice."""
    pools.queued.append(FakePool(per_poll=1, interrupt_after_polls=4))
    first = _tune(trials=20, db=url, warm_start=0)
    left = _running(url, first.study)
    assert first.status == "interrupted" and left and all(r.owner is None for r in left)
    repo = open_repository(url)
    record = _study(url, first.study)
    measured = {t.key for t in repo.trials(record.id)} | {r.key for r in left}
    fresh = next(c for c in valid_configs(toy) if params_key(c) not in measured)
    repo.claim_trial(record.id, fresh, owner=f"{__import__('socket').gethostname()}:{_dead_pid()}")

    second = _tune(trials=20, db=url, warm_start=0)
    assert second.status == "finished" and second.previous == first.measured
    assert first.measured + second.measured == 20 and _running(url, first.study) == []
    submitted = [params_key(p) for p in pools.used[1].submitted]
    assert set(submitted[: len(left) + 1]) == {r.key for r in left} | {params_key(fresh)}
    trials = repo.trials(record.id)
    assert len({t.key for t in trials}) == len({t.number for t in trials}) == len(trials) == 20
    assert all(t.gpu_state == clocks_of(t.params) for t in trials if t.ok)


def test_owner_liveness():
    import os
    import socket
    from datetime import datetime, timedelta

    here = socket.gethostname()
    now = datetime(2026, 11, 22, 12, 0)
    assert search.owner_alive(f"{here}:{os.getppid()}", now, now)
    assert not search.owner_alive(f"{here}:{os.getpid()}", now, now)  # this process: settled
    assert not search.owner_alive(f"{here}:{_dead_pid()}", now, now)
    assert search.owner_alive("elsewhere:12", now - timedelta(seconds=30), now)
    assert not search.owner_alive("elsewhere:12", now - timedelta(minutes=2), now)  # not renewed
    assert not search.owner_alive(f"{here}:{os.getppid()}", now - timedelta(minutes=2), now)
    assert not search.owner_alive(None, now, now)


def test_the_loop_runs_with_the_collector_quiet_and_puts_it_back(toy, db, pools, monkeypatch):
    import gc

    before, seen = gc.get_threshold(), []
    real_poll = FakePool.poll

    def poll(self, timeout):
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        return real_poll(self, timeout)

    monkeypatch.setattr(FakePool, "poll", poll)
    assert _tune(trials=12, db=db).measured == 12
    assert seen and all(young >= tuner.study.gc_tuning.YOUNG_THRESHOLD and frozen > 0 for young, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_fastest_known_config_is_kept_as_results_come_and_found_again_when_remeasured():
    """The early-stop bar and the incumbent read the fastest finite objective kept as each comes
    (no scan of every known config a poll); a config told again slower than it was, the best,
    has the best found again among the rest."""
    from math import inf

    c = loop.Coordinator.__new__(loop.Coordinator)  # only the bookkeeping of known objectives
    c._known, c._best_known = {}, None
    c._know("a", inf)
    assert c._best_known is None
    for key, value in (("b", 2.0), ("c", 3.0), ("d", 1.5), ("e", 1.5)):
        c._know(key, value)
    assert c._best_known == (1.5, "d")  # ties: the least key, as min() over (value, key) gives
    c._know("d", 4.0)  # measured again, slower
    assert c._best_known == (1.5, "e")
    c._know("e", inf)
    assert c._best_known == (2.0, "b")
    c._know("c", 0.5)
    assert c._best_known == (0.5, "c") == min((v, k) for k, v in c._known.items())


def test_a_stop_asked_for_ends_the_study_there_and_stores_what_was_in_flight(toy, db, pools):
    """``stop_when`` (a cancelled job's slice): asked before each new trial; once it gives a
    reason no more trials are asked, those in flight are measured and stored, none left running."""
    from tuner import lookup
    from workers.pool_options import PoolOptions

    pool = FakePool()
    pools.queued.append(pool)
    fam = lookup.family("toy")
    problem = lookup.problem(fam, *PROBLEM, {})

    def stop_when():
        return "its job was cancelled" if len(pool.submitted) >= 6 else None

    result = api.tune_here(fam, problem, db, StudyOptions(trials=60, sampler="random", seed=0, retime=0),
                           PoolOptions(), stop_when=stop_when)
    assert result.status == "finished" and result.reason == "its job was cancelled"
    trials = open_repository(db).trials(_study_id(db))
    assert 6 <= len(trials) == len(pool.submitted) < 60  # every trial sent was stored
    assert _running(db, result.study) == []


def _study_id(db):
    return open_repository(db).studies()[0].id


def test_ptxas_notes_of_a_cut_wgmma_pipeline_are_told_once_a_run(toy, db, pools, monkeypatch, caplog):
    """A trial whose compile ptxas serialized (its C7514 note) is stored as any other; the run
    says so once, however many trials carry the note."""
    import logging
    from dataclasses import replace

    import tuner_doubles

    plain = tuner_doubles.measure
    note = "C7514: Potential Performance Loss: wgmma.mma_async instructions are serialized"

    def noted(params):
        m = plain(params)
        return replace(m, advisories=(note,)) if params["BLOCK_M"] in (16, 32, 64) else m

    monkeypatch.setattr(tuner_doubles, "measure", noted)
    with caplog.at_level(logging.WARNING, logger="tuner"):
        result = _tune(trials=20, db=db)
    assert result.measured == 20
    told = [r.getMessage() for r in caplog.records if "ptxas C7514" in r.getMessage()]
    assert len(told) == 1 and told[0].startswith("trial ") and "tuner lint" in told[0], told
