"""The sampler's in-memory study and the database study it mirrors, on SQLite and PostgreSQL."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from storage.engine import absolute_sqlite
from templates.family import Param
from tuner import search
from tuner.mirror import MirroredStudy
from tuner.study_writer import RayWriter

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
    assert running.user_attrs == {"owner": "here:1", "mirror": mirror._token}
    assert mirror.number(measured) == running.number
    mirror.tell(measured, 0.5, tflops=10.0)
    (done,) = _trials(url)
    assert done.state == TrialState.COMPLETE and done.value == 0.5 and done.user_attrs["tflops"] == 10.0
    # the sampler learned both
    assert [t.value for t in mirror.memory.get_trials(deepcopy=False)] == [float("inf"), 0.5]


def test_a_repeat_fails_in_memory_and_a_queued_one_is_told_in_the_database(url):
    """The sampler keeps one trial per config; a queued database trial still gets its value."""
    _database_study(url).enqueue_trial(SPACE.encode({"A": 3, "B": "y"}))
    mirror = MirroredStudy(_database_study(url))
    queued = mirror.ask(SPACE.distributions)  # measured before, say: a repeat from the queue
    mirror.repeated(queued, 0.25, reused=True)
    fresh = mirror.ask(SPACE.distributions)
    mirror.repeated(fresh, 0.5, reused=True)  # never recorded: nothing reaches the database
    assert [t.state for t in mirror.memory.get_trials(deepcopy=False)] == [TrialState.FAIL] * 2
    (told,) = _trials(url)
    assert told.state == TrialState.COMPLETE and told.value == 0.25 and told.user_attrs["reused"]


def test_queued_trials_are_asked_from_the_database_once(url):
    _database_study(url).enqueue_trial(SPACE.encode({"A": 3, "B": "y"}))
    first = MirroredStudy(_database_study(url))
    second = MirroredStudy(_database_study(url))  # another coordinator on the same study
    proposal = first.ask(SPACE.distributions)
    assert SPACE.decode(proposal.params) == {"A": 3, "B": "y"} and proposal.created is not None
    other = second.ask(SPACE.distributions)  # the queue is empty now: a proposal of its sampler
    assert other.created is None
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
    assert sorted(t.number for t in failed) == sorted([mirror.number(left), mirror.number(dropped)])
    (waiting,) = _trials(url, TrialState.WAITING)
    assert waiting.system_attrs["fixed_params"] == left.params
    again = MirroredStudy(_database_study(url)).ask(SPACE.distributions)  # the next run
    assert again.params == left.params


def test_the_sampler_moves_to_memory_and_the_database_keeps_a_cheap_one(url):
    tpe = search.make_sampler("tpe", SPACE, seed=0)
    study = _database_study(url, tpe)
    mirror = MirroredStudy(study)
    assert mirror.sampler is tpe and isinstance(study.sampler, optuna.samplers.RandomSampler)


@pytest.fixture(scope="module")
def ray_up():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING")
    yield ray
    if started:
        ray.shutdown()


def test_a_ray_writer_makes_the_same_database_study(url, ray_up):
    """The writes go through an actor, in order; the coordinator never waits for a create."""
    study = _database_study(url)  # the actor loads the study: it must exist first
    writer = RayWriter(url, "mirror")
    mirror = MirroredStudy(study, writer=writer)
    proposals = [mirror.ask(SPACE.distributions) for _ in range(6)]
    for proposal in proposals:
        mirror.record(proposal, owner="here:1")
    for value, proposal in enumerate(proposals[:4]):
        mirror.tell(proposal, value / 10, tflops=1.0)  # sent before the creates are known here
    mirror.abandon(proposals[4])
    mirror.drop(proposals[5])
    mirror.flush()
    assert mirror.number(proposals[0], wait=False) is not None  # written: known without waiting
    trials = {t.number: t for t in _trials(url)}
    numbers = [mirror.number(p) for p in proposals]
    assert sorted(numbers) == list(range(6))
    for value, number in enumerate(numbers[:4]):
        assert trials[number].state == TrialState.COMPLETE and trials[number].value == value / 10
        assert trials[number].user_attrs["tflops"] == 1.0 and trials[number].params == proposals[value].params
    assert trials[numbers[4]].state == trials[numbers[5]].state == TrialState.FAIL
    (waiting,) = _trials(url, TrialState.WAITING)
    assert waiting.system_attrs["fixed_params"] == proposals[4].params
    assert mirror.sync(force=True).running == ()  # its own trials are not another coordinator's
    writer.close()


def test_a_ray_writer_raises_the_database_error(tmp_path, ray_up):
    writer = RayWriter(f"sqlite:///{tmp_path / 'empty.db'}", "no such study")
    with pytest.raises(KeyError, match="Record does not exist"):  # Optuna's own words
        writer.flush()
    writer.close()


def test_sqlite_paths_are_made_absolute_for_the_actor(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_sqlite("sqlite:///tuner.db") == f"sqlite:///{tmp_path / 'tuner.db'}"
    assert absolute_sqlite("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert absolute_sqlite("postgresql://u@h:5432/test") == "postgresql://u@h:5432/test"
