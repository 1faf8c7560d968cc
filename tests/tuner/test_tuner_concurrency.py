"""Interruption and concurrency through real processes: real ``tuner tune`` commands, each with
its own local Ray, on replayed landscapes (tests/data) and real databases, SQLite files and the
local PostgreSQL (``url``).

Two coordinators sharing a study run on PostgreSQL by default (SQLite in the soak tier); the
kills, on SQLite, and on PostgreSQL in the soak tier (``pytest -m soak``): what differs on
PostgreSQL, a lease left by a dead owner taken over and a killed study resumed, is tested on
both backends in this process (tests/storage/test_storage_leases.py,
tests/tuner/test_tuner_loop.py). A Ctrl-C the moment Ray starts to start and 4.5 s after run in
the soak tier too: 2.0 s after, and once Ray is up, by default; SIGTERM 2.0 s after by default,
once Ray is up in the soak tier."""

from __future__ import annotations

import re
import signal
import time

import pytest

from coordinators import OTHER, Coordinator, assert_settled_once, stored_keys, tune_argv


# SQLite by default, PostgreSQL in the soak tier (the module's docstring says why)
SQLITE_THEN_SOAK_POSTGRESQL = pytest.mark.parametrize(
    "url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.soak)], indirect=True)


# PostgreSQL by default, SQLite in the soak tier (two coordinators on one study)
POSTGRESQL_THEN_SOAK_SQLITE = pytest.mark.parametrize(
    "url", [pytest.param("sqlite", marks=pytest.mark.soak), "postgresql"], indirect=True)


def _measured(out: str) -> int:
    found = re.search(r"trials\s+(\d+) measured", out)
    assert found, out
    return int(found.group(1))


@POSTGRESQL_THEN_SOAK_SQLITE
def test_two_coordinators_share_one_study_and_stop_together_at_its_trial_count(url, tmp_path):
    """The same command twice at once: each config measured by one of them, once; 300 stored in
    all (not 600), and each says how many the other measured. 300 of the landscape's 744 configs:
    a coordinator alone replays them in about 12 s, so that the two overlap even where one's Ray
    starts seconds after the other's (on a loaded machine, 150 can all be replayed by one first)."""
    argv = tune_argv(url, 300)
    first, second = Coordinator(argv, tmp_path), Coordinator(argv, tmp_path)
    results = [first.finish(), second.finish()]
    for code, out, err in results:
        assert code == 0, err[-2000:]
        assert "status    finished: 300 trials measured" in out and "by other coordinators" in out
    (keys,) = stored_keys(url).values()
    assert len(keys) == len(set(keys)) == 300
    assert sum(_measured(out) for _, out, _ in results) == 300
    assert all(_measured(out) > 0 for _, out, _ in results)  # both did a share of the work


@pytest.mark.soak  # the kill -9 below and the two coordinators above cover its parts by default
@SQLITE_THEN_SOAK_POSTGRESQL
def test_a_coordinator_killed_beside_another_leaves_it_the_study(url, tmp_path):
    """Two coordinators on one study, one killed with ``kill -9`` mid-study: the other takes over
    the configs its leases held (its pid is gone) and completes the study alone, to its count,
    nothing measured twice. 600 of the landscape's 744 configs: on an unloaded machine a
    coordinator replays about 25 trials a second, and a study of 200 could end before the
    killed one was seen holding a lease."""
    argv = tune_argv(url, 600)
    survivor, killed = Coordinator(argv, tmp_path), Coordinator(argv, tmp_path)
    killed.wait_for_trials()
    survivor.wait_for_trials()
    time.sleep(0.2)
    left = killed.kill_holding_a_lease(url, others=[survivor])
    assert left and killed.finish()[0] == -signal.SIGKILL
    code, out, err = survivor.finish()
    assert code == 0, err[-2000:]
    assert "status    finished: 600 trials measured" in out
    assert_settled_once(left, err, url)  # each lease the killed one held, settled by the survivor, once
    (keys,) = stored_keys(url).values()
    assert len(keys) == len(set(keys)) == 600
    assert killed.leftovers() == [] and survivor.leftovers() == []


@pytest.mark.soak
def test_two_studies_on_one_sqlite_file_at_once_lose_nothing(tmp_path):
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    shape, landscape = OTHER
    one = Coordinator(tune_argv(db, 120), tmp_path)
    two = Coordinator(tune_argv(db, 120, shape=shape, landscape=landscape), tmp_path)
    for code, out, err in (one.finish(), two.finish()):
        assert code == 0, err[-2000:]
        assert "locked" not in err and "locked" not in out
    studies = stored_keys(db)
    assert len(studies) == 2
    assert all(len(keys) == len(set(keys)) == 120 for keys in studies.values())


@SQLITE_THEN_SOAK_POSTGRESQL
def test_kill_9_mid_study_then_the_same_command_finishes_it(url, tmp_path):
    """``kill -9`` of the coordinator: its Ray goes with it (every process it started ends within
    seconds), and the same command keeps what was stored, measures what was in flight first,
    and nothing twice."""
    argv = tune_argv(url, 200)
    killed = Coordinator(argv, tmp_path)
    killed.wait_for_trials()
    killed.wait_for_stored(url)  # then at once: on a fast machine the rest of the study takes a second
    left = killed.kill_holding_a_lease(url)
    code, _, _ = killed.finish()
    assert left
    assert code == -signal.SIGKILL
    assert killed.leftovers() == []
    (before,) = stored_keys(url).values()
    assert 0 < len(before) < 200

    again = Coordinator(argv, tmp_path)
    code, out, err = again.finish()
    assert code == 0, err[-2000:]
    assert f"{len(before)} from earlier runs" in out
    assert_settled_once(left, err, url)  # in flight at the kill
    (after,) = stored_keys(url).values()
    assert after[: len(before)] == before and len(after) == len(set(after)) == 200
    assert again.leftovers() == []


@pytest.mark.parametrize(("signum", "moment", "after_s"), [
    pytest.param(signal.SIGINT, "starting Ray", 0.0, marks=pytest.mark.soak),  # as 2.0 s in
    (signal.SIGINT, "starting Ray", 2.0),
    pytest.param(signal.SIGINT, "starting Ray", 4.5, marks=pytest.mark.soak),  # as 2.0 s in, or as "Ray is up"
    (signal.SIGINT, "Ray is up", 0.0),  # the workers starting
    (signal.SIGTERM, "starting Ray", 2.0),
    # as SIGINT once Ray is up (SIGTERM raises the same KeyboardInterrupt there), and as SIGTERM
    # mid-study (test_tuner_replay.py: the handler Ray's start leaves)
    pytest.param(signal.SIGTERM, "Ray is up", 0.0, marks=pytest.mark.soak),
])
def test_a_signal_during_start_up_ends_the_command_with_its_ray(tmp_path, signum, moment, after_s):
    """Ctrl-C or SIGTERM at moments of start-up (``after_s`` after the ``-v`` line ``moment``:
    while ``ray.init`` runs, which takes 5-8 s here, and while the workers start): the command
    says it was interrupted, exits 130 and leaves no Ray process behind; no crash, no native
    stack dump, no study run to its end."""
    db = f"sqlite:///{tmp_path / 'start.db'}"
    coordinator = Coordinator([*tune_argv(db, 400), "-v"], tmp_path)
    assert coordinator.wait_for_line(moment), "".join(coordinator.err_lines)[-2000:]
    time.sleep(after_s)
    coordinator.process.send_signal(signum)
    code, out, err = coordinator.finish(timeout=60)
    assert code == 130, (code, err[-3000:])
    assert "tuner: interrupted" in err or "status    interrupted" in out, err[-2000:]
    assert "Traceback" not in err and "SIGSEGV" not in err and "logging.cc" not in err, err[-3000:]
    assert "400 trials measured" not in out
    assert coordinator.leftovers() == []
