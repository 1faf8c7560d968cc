"""The sampler's in-memory study and the database study it mirrors, on SQLite and PostgreSQL."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from templates.family import Param
from tuner import search
from tuner.mirror import MirroredStudy

SPACE = search.SearchSpace((Param("A", (1, 2, 3, 4)), Param("B", ("x", "y"))))


def _database_study(url, sampler=None):
    return search.open_study("mirror", url, sampler or search.make_sampler("random", SPACE, seed=0))


def _trials(url, *states):
    trials = optuna.load_study(study_name="mirror", storage=url).get_trials(deepcopy=False)
    return [t for t in trials if not states or t.state in states]


def test_only_recorded_proposals_reach_the_database(url):
    mirror = MirroredStudy(_database_study(url))
    rejected = mirror.ask(SPACE.distributions)
    mirror.tell(rejected, float("inf"), failure="invalid")
    measured = mirror.ask(SPACE.distributions)
    mirror.record(measured, owner="here:1")
    (running,) = _trials(url)
    assert running.state == TrialState.RUNNING and running.params == measured.params
    assert running.user_attrs == {"owner": "here:1"} and measured.number == running.number
    mirror.tell(measured, 0.5, tflops=10.0)
    (done,) = _trials(url)
    assert done.state == TrialState.COMPLETE and done.value == 0.5 and done.user_attrs["tflops"] == 10.0
    # the sampler learned both
    assert [t.value for t in mirror.memory.get_trials(deepcopy=False)] == [float("inf"), 0.5]


def test_queued_trials_are_asked_from_the_database_once(url):
    _database_study(url).enqueue_trial(SPACE.encode({"A": 3, "B": "y"}))
    first = MirroredStudy(_database_study(url))
    second = MirroredStudy(_database_study(url))  # another coordinator on the same study
    proposal = first.ask(SPACE.distributions)
    assert SPACE.decode(proposal.params) == {"A": 3, "B": "y"} and proposal.durable is not None
    other = second.ask(SPACE.distributions)  # the queue is empty now: a proposal of its sampler
    assert other.durable is None
    assert not _trials(url, TrialState.WAITING)


def test_sync_brings_in_what_another_coordinator_measured_or_measures(url):
    mine = MirroredStudy(_database_study(url), sync_interval_s=3600.0)
    theirs = MirroredStudy(_database_study(url))
    done, busy = theirs.ask(SPACE.distributions), theirs.ask(SPACE.distributions)
    for proposal in (done, busy):
        theirs.record(proposal, owner="elsewhere:7")
    theirs.tell(done, 0.25)
    assert mine.sync() is None  # within the interval nothing is read
    synced = mine.sync(force=True)
    assert [t.params for t in synced.finished] == [done.params]
    assert [t.params for t in synced.running] == [busy.params]
    (copied,) = mine.memory.get_trials(deepcopy=False)
    assert copied.value == 0.25 and copied.params == done.params
    assert not mine.sync(force=True).finished  # copied once


def test_abandoned_proposals_are_queued_again_and_dropped_ones_not(url):
    mirror = MirroredStudy(_database_study(url))
    left, dropped = mirror.ask(SPACE.distributions), mirror.ask(SPACE.distributions)
    mirror.record(left)
    mirror.record(dropped)
    mirror.abandon(left)
    mirror.drop(dropped)
    failed = _trials(url, TrialState.FAIL)
    assert sorted(t.number for t in failed) == sorted([left.number, dropped.number])
    (waiting,) = _trials(url, TrialState.WAITING)
    assert waiting.system_attrs["fixed_params"] == left.params
    again = MirroredStudy(_database_study(url)).ask(SPACE.distributions)  # the next run
    assert again.params == left.params


def test_the_sampler_moves_to_memory_and_the_database_keeps_a_cheap_one(url):
    tpe = search.make_sampler("tpe", SPACE, seed=0)
    study = _database_study(url, tpe)
    mirror = MirroredStudy(study)
    assert mirror.sampler is tpe and isinstance(study.sampler, optuna.samplers.RandomSampler)
