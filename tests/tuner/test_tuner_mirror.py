"""The sampler's in-memory study and the stored trials it is rebuilt from, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from storage import TrialOutcome, open_repository, params_key
from storage.engine import absolute_sqlite
from templates.family import Param
from tuner.study import search
from tuner.study.final_best import candidates
from tuner.study.mirror import MirroredStudy, objective
from tuner.study.optuna_export import optuna_trials

SPACE = search.SearchSpace((Param("A", (1, 2, 3, 4)), Param("B", ((1, 2), (2, 1)))))  # tuples: repr


@pytest.fixture
def repo(url):
    repository = open_repository(url)
    yield repository
    repository.close()


@pytest.fixture
def study_id(repo):
    device = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_capability": "9.0",
              "driver_version": "580.65", "cuda_version": "13.0"}
    return repo.open_study("mirror", family="toy", template_hash="0123456789abcdef",
                           space={"A": [1, 2, 3, 4]}, shape=[1, 2], dtype="fp16", flags={},
                           device=device, sampler="random", replay=False, settings={}).id


def _mirror(repo, study_id, sampler=None, owner="here:1"):
    mirror = MirroredStudy(repo, study_id, SPACE, sampler or search.make_sampler("random", SPACE, seed=0),
                           owner=owner)
    mirror.sync(force=True)
    return mirror


def _result(median_ms=0.5):
    return TrialOutcome("ok", median_ms=median_ms, gpu_state={"sm_mhz": 1755, "temperature_c": 61})


def test_only_recorded_proposals_reach_the_database(repo, study_id):
    mirror = _mirror(repo, study_id)
    rejected = mirror.ask(SPACE.distributions)
    mirror.tell(rejected, float("inf"))
    measured = mirror.ask(SPACE.distributions)
    params = SPACE.decode(measured.params)
    number = mirror.record(measured, params)
    (running,) = repo.running(study_id)
    assert (running.number, running.owner, running.key) == (number, "here:1", params_key(params))
    assert running.params == {"A": params["A"], "B": list(params["B"])}  # JSON: a tuple reads back a list
    assert repo.trials(study_id) == []
    mirror.finish(measured, 0.5, params, _result())
    (stored,) = repo.trials(study_id)
    assert (stored.number, stored.median_ms, stored.gpu_state["sm_mhz"]) == (number, 0.5, 1755)
    assert repo.running(study_id) == []  # one record: the running trial became the measured one
    assert [t.value for t in mirror.memory.get_trials(deepcopy=False)] == [float("inf"), 0.5]


def test_numbers_are_taken_once_across_measured_and_running_trials(repo, study_id):
    one = _mirror(repo, study_id)
    two = _mirror(repo, study_id, search.make_sampler("random", SPACE, seed=5), owner="there:2")
    a, b = one.ask(SPACE.distributions), two.ask(SPACE.distributions)
    assert a.params != b.params
    numbers = [one.record(a, SPACE.decode(a.params)), two.record(b, SPACE.decode(b.params))]
    one.finish(a, 0.25, SPACE.decode(a.params), _result(0.25))
    c = one.ask(SPACE.distributions)
    numbers.append(one.record(c, SPACE.decode(c.params)))
    assert numbers == [0, 1, 2]


def test_a_config_leased_by_another_mirror_is_refused_and_renewed_leases_stay_its_own(repo, study_id):
    from storage import ClaimRefused

    one, two = _mirror(repo, study_id), _mirror(repo, study_id, owner="there:2")
    a, b = one.ask(SPACE.distributions), two.ask(SPACE.distributions)
    assert a.params == b.params  # same sampler, same seed: the same config
    one.record(a, SPACE.decode(a.params))
    with pytest.raises(ClaimRefused) as refused:
        two.record(b, SPACE.decode(b.params))
    assert refused.value.why == "held" and b.number is None
    before = repo.running(study_id)[0].heartbeat_at
    one.renew(force=True)
    assert repo.running(study_id)[0].heartbeat_at >= before


def test_a_resumed_study_is_rebuilt_from_the_stored_trials(repo, study_id):
    first = _mirror(repo, study_id)
    told = []
    for value in (0.3, float("nan")):
        proposal = first.ask(SPACE.distributions)
        params = SPACE.decode(proposal.params)
        first.record(proposal, params)
        ok = value == value
        result = _result(value) if ok else TrialOutcome("failed", failure="crash", reason="illegal address")
        first.finish(proposal, value if ok else search.FAILED_VALUE, params, result)
        told.append((proposal.params, value if ok else search.FAILED_VALUE))
    again = MirroredStudy(repo, study_id, SPACE, search.make_sampler("tpe", SPACE, seed=1))
    synced = again.sync(force=True)
    assert [t.number for t in synced.finished] == [0, 1]
    rebuilt = again.memory.get_trials(deepcopy=False)
    assert [(t.params, t.value, t.state) for t in rebuilt] == [
        (params, value, TrialState.COMPLETE) for params, value in told]
    assert again.sync(force=True).finished == ()  # taken once


def test_sync_brings_in_what_another_coordinator_measured_or_measures(repo, study_id):
    mine = MirroredStudy(repo, study_id, SPACE, search.make_sampler("random", SPACE, seed=0),
                         sync_interval_s=3600.0)
    mine.sync(force=True)
    theirs = _mirror(repo, study_id, owner="elsewhere:7")
    done, busy = theirs.ask(SPACE.distributions), theirs.ask(SPACE.distributions)
    for proposal in (done, busy):
        theirs.record(proposal, SPACE.decode(proposal.params))
    theirs.finish(done, 0.25, SPACE.decode(done.params), _result(0.25))
    assert mine.sync() is None  # within the interval nothing is read
    synced = mine.sync(force=True)
    assert [t.number for t in synced.finished] == [done.number]
    assert [(t.number, t.owner) for t in synced.running] == [(busy.number, "elsewhere:7")]
    (copied,) = mine.memory.get_trials(deepcopy=False)
    assert copied.value == 0.25 and copied.params == done.params
    assert theirs.sync(force=True).running == ()  # its own running trials are not another's


def test_a_sync_reads_in_full_only_the_trials_its_memory_lacks(repo, study_id, monkeypatch):
    """Once the memory holds the study's trials, a sync reads their numbers and then the new
    trials alone: its cost follows what others stored, not the study's size."""
    mine = _mirror(repo, study_id)
    for a in (1, 2, 3):
        mine.enqueue({"A": a, "B": (1, 2)})
        proposal = mine.ask(SPACE.distributions)
        params = SPACE.decode(proposal.params)
        mine.record(proposal, params)
        mine.finish(proposal, 0.5, params, _result())
    theirs = _mirror(repo, study_id, owner="elsewhere:7")
    theirs.enqueue({"A": 4, "B": (1, 2)})
    done = theirs.ask(SPACE.distributions)
    theirs.record(done, SPACE.decode(done.params))
    theirs.finish(done, 0.25, SPACE.decode(done.params), _result(0.25))
    reads = []
    original = repo.trials
    monkeypatch.setattr(repo, "trials", lambda study, numbers=None: reads.append(numbers) or original(study, numbers))
    synced = mine.sync(force=True)
    assert [t.number for t in synced.finished] == [done.number]
    assert reads == [[done.number]]  # the new trial alone, by its number
    assert mine.sync(force=True).finished == () and reads == [[done.number]]  # nothing new: nothing read
    assert sorted(t.number for t in original(study_id, [done.number, 0, 99])) == [0, done.number]
    assert repo.trial_numbers(study_id) == [t.number for t in original(study_id)]


def test_abandoned_trials_are_left_ownerless_and_dropped_ones_forgotten(repo, study_id):
    mirror = _mirror(repo, study_id)
    left, dropped = mirror.ask(SPACE.distributions), mirror.ask(SPACE.distributions)
    mirror.record(left, SPACE.decode(left.params))
    mirror.record(dropped, SPACE.decode(dropped.params))
    mirror.abandon(left)
    mirror.drop(dropped)
    (running,) = repo.running(study_id)
    assert (running.number, running.owner) == (left.number, None)
    assert [t.state for t in mirror.memory.get_trials(deepcopy=False)] == [TrialState.FAIL] * 2
    assert repo.drop_trial(study_id, left.number) and not repo.drop_trial(study_id, left.number)


def test_enqueued_configs_are_asked_first(repo, study_id):
    mirror = _mirror(repo, study_id, search.make_sampler("tpe", SPACE, seed=0))
    mirror.enqueue({"A": 3, "B": (2, 1)})
    assert SPACE.decode(mirror.ask(SPACE.distributions).params) == {"A": 3, "B": (2, 1)}


def test_the_configs_waiting_are_counted_as_optuna_holds_them(repo, study_id):
    mirror = _mirror(repo, study_id, search.make_sampler("tpe", SPACE, seed=0))

    def held() -> int:
        return len(mirror.memory.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    assert mirror.waiting() == held() == 0
    for a in (1, 2, 3):
        mirror.enqueue({"A": a, "B": (1, 2)})
    assert mirror.waiting() == held() == 3
    asked = [SPACE.decode(mirror.ask(SPACE.distributions).params)["A"] for _ in range(2)]
    assert asked == [1, 2] and mirror.waiting() == held() == 1
    mirror.ask(SPACE.distributions)
    mirror.ask(SPACE.distributions)  # the sampler's own: nothing was waiting
    assert mirror.waiting() == held() == 0
    mirror.enqueue({"A": 4, "B": (2, 1)})
    assert mirror.waiting() == held() == 1



def test_two_gpus_results_rank_alike_for_the_store_the_sampler_the_export_and_the_retiming(repo, study_id):
    """A (GPU 1, raw 1.144, 1.10 on the reference GPU) and B (GPU 0, raw 1.12), stored in one
    ``record_trials`` call: A is the stored best, the sampler's and the Optuna copy's best, and
    the re-timing's first candidate."""
    a = TrialOutcome("ok", median_ms=1.144, normalized_ms=1.10, gpu_ratio=1.10 / 1.144, gpu_index=1,
                     cubin_hash="a")
    b = TrialOutcome("ok", median_ms=1.12, normalized_ms=1.12, gpu_ratio=1.0, gpu_index=0, cubin_hash="b")
    repo.record_trials(study_id, [(0, {"A": 1, "B": [1, 2]}, a), (1, {"A": 2, "B": [1, 2]}, b)])
    trials = repo.trials(study_id)
    assert repo.best("toy", [1, 2], "fp16", {}).trial_number == 0
    assert [objective(t) for t in trials] == [1.10, 1.12]
    assert [t.value for t in optuna_trials(trials)] == [1.10, 1.12]
    assert [t.number for t in candidates(trials, 2)] == [0, 1]


def test_sqlite_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_sqlite("sqlite:///tuner.db") == f"sqlite:///{tmp_path / 'tuner.db'}"
    assert absolute_sqlite("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert absolute_sqlite("postgresql://u@h:5432/test") == "postgresql://u@h:5432/test"
