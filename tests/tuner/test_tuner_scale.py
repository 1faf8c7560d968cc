"""Scale: batched asks, leases and results; TPE's batch proposer; simulated GPUs.

The coordinator runs on the toy family and a fake pool (real Optuna, real storage), the batch
proposer on its own, and one study on simulated GPUs through real Ray on a recorded landscape.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np
import pytest

import tuner
from storage import ClaimRefused, TrialOutcome, open_repository, params_key
from tuner.cli.commands import main
from tuner.study import search
from tuner.study.batchtpe import BatchProposer
from tuner_doubles import PROBLEM, latency_ms, valid_configs
from workers.results import Measurement, Timing
from workers.simulate import (EARLY_REPS, FLUSH_S, TRIAL_OVERHEAD_S, WARMUP_S, busy_shares, gpu_time, host_counts,
                              steady_window)

LANDSCAPE = "tests/data/attention_4x8x512x64-fp16-causal_h200.json"
SIMULATED = ("attention", "4,8,512,64", "fp16", {"causal": True})


@pytest.fixture(autouse=True, scope="module")
def _ray_of_their_own():
    """These tests start a local Ray with simulated GPUs (Ray's custom resources), which a Ray
    already up in this process lacks: the workers' session Ray, where tests/workers ran first in
    one pytest run. That one is stopped for them and started again after, as it was."""
    import ray

    was_up = ray.is_initialized()
    if was_up:
        ray.shutdown()
    yield
    if was_up and not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")


def _stored_keys(db: str, name: str) -> list[str]:
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == name)
    keys = [params_key(t.params) for t in repo.trials(study.id)]
    assert repo.running(study.id) == []  # every lease settled
    return keys


@pytest.mark.parametrize("sampler, liar", [("tpe", True), ("tpe", False), ("optuna-tpe", True), ("optuna-tpe", False)])
def test_liar_or_not_a_study_reaches_its_count_with_no_config_twice_in_batched_transactions(
        toy, db, pools, sampler, liar):
    result = tuner.tune("toy", *PROBLEM, trials=30, db=db, seed=3, constant_liar=liar,
                        warm_start=0, sampler=sampler)
    assert result.status == "finished" and result.measured == 30
    keys = _stored_keys(db, result.study)
    assert len(keys) == len(set(keys)) == 30
    assert pools.used[0].submitted and len(pools.used[0].submitted) == 30
    throughput = result.throughput
    assert throughput.measured == 30 and throughput.asks >= 30 and throughput.trials_per_s > 0
    calls = throughput.db_calls  # leases and results in batches: fewer transactions than trials
    assert "claim_trial" not in calls and "record_trial" not in calls
    assert calls["claim_trials"][0] < 30 and calls["record_trials"][0] < 30


def test_the_batch_proposers_picks_are_not_checked_again(toy, db, pools, monkeypatch):
    """Its picks are the family's valid configs, checked once when the study lists them; the
    samplers that propose anywhere in the space have each proposal checked."""
    checked = Counter()
    original = type(toy).check

    def counting(self, params, problem, limits):
        checked[params_key(params)] += 1
        return original(self, params, problem, limits)

    monkeypatch.setattr(type(toy), "check", counting)
    space_size = search.SearchSpace(toy.params).size
    tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=3, warm_start=0)
    assert sum(checked.values()) == space_size  # the listing's checks alone: one a config
    checked.clear()
    tuner.tune("toy", *PROBLEM, trials=20, db=db.replace("tuner.db", "other.db"), seed=3, warm_start=0,
               sampler="optuna-tpe")
    assert sum(checked.values()) > space_size  # and then each proposal's


def test_a_batched_study_resumes_to_a_larger_count_and_finds_what_tpe_finds(toy, db, pools):
    first = tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=1)
    again = tuner.tune("toy", *PROBLEM, trials=40, db=db, seed=1, sampler="tpe-batch")  # its old name
    assert again.previous == 20 and again.measured == 20
    keys = _stored_keys(db, first.study)
    assert len(keys) == len(set(keys)) == 40
    best_ok = min(latency_ms(c) for c in valid_configs(toy) if c["WARPS"] != 4 or c["STAGES"] != 2)
    assert again.best.median_ms <= 1.5 * best_ok


def _proposer(toy, **options):
    space = search.SearchSpace(toy.params)
    return space, BatchProposer(space, valid_configs(toy), seed=0, **options)


@pytest.mark.parametrize("liar", [True, False])
def test_the_batch_proposer_proposes_new_valid_configs_only(toy, liar):
    space, proposer = _proposer(toy, liar=liar)
    valid = {params_key(c) for c in valid_configs(toy)}
    configs = sorted(valid_configs(toy), key=latency_ms)
    observed = [(space.encode(c), latency_ms(c)) for c in configs[::3]]
    observed.append((space.encode({"BLOCK_M": 16, "BLOCK_N": 16, "WARPS": 1, "STAGES": 1}), math.inf))
    pending = [space.encode(c) for c in configs[1::3]][:5]
    picks = proposer.propose(observed=observed, pending=pending, count=8)
    keys = [params_key(space.decode(p)) for p in picks]
    assert len(keys) == len(set(keys)) == 8
    seen = {params_key(space.decode(p)) for p, _ in observed} | {params_key(space.decode(p)) for p in pending}
    assert all(k in valid and k not in seen for k in keys)
    free = len(valid - seen)
    assert len(proposer.propose(observed=observed, pending=pending, count=10 * free)) == free


def test_the_batch_proposer_reads_a_growing_list_of_observations_as_a_whole_one(toy):
    """Told a list that grows at its end, the proposer reads only the new entries; a list that
    does not continue the last is read whole. Either way it proposes as a proposer told the
    same list at once."""
    space, _ = _proposer(toy)
    configs = sorted(valid_configs(toy), key=latency_ms)
    told = [(space.encode(c), latency_ms(c)) for c in configs[::2]]

    def picks_after(*lists):
        _, proposer = _proposer(toy)
        for observed in lists[:-1]:
            proposer._observed.update(observed)
        return proposer.propose(observed=lists[-1], pending=[], count=5)

    whole = picks_after(told)
    assert picks_after(told[:7], told[:12], told) == whole  # read in three parts
    shuffled = told[::-1]  # the same observations, not a continuation: read again
    assert picks_after(told[:12], shuffled) == picks_after(shuffled)
    assert picks_after(told[:12], told[:5]) == picks_after(told[:5])  # shorter: read again


def test_the_batch_proposers_densities_are_optunas_parzen_estimators(toy):
    """l(x) and g(x), summed over match counts, equal the mixture Optuna's TPE builds: each
    observation a product over parameters of (1[same choice] + a) / (1 + k a), a = 1 / (n + 1),
    plus a uniform prior component, all of equal weight."""
    space, proposer = _proposer(toy)
    configs = valid_configs(toy)
    encoded = [space.encode(c) for c in configs]
    counts = [len(space.distributions[n].choices) for n in proposer.names]
    for observed in (encoded[:1], encoded[::7], encoded[::2]):
        n, a = len(observed), 1 / (len(observed) + 1)
        histogram = sum(np.eye(len(proposer.names) + 1)[proposer.matches(proposer.row(o))] for o in observed)
        density = proposer._density(histogram, n)
        for at, config in zip(density, encoded):
            kernels = sum(math.prod(((config[p] == o[p]) + a) / (1 + k * a) for p, k in zip(proposer.names, counts))
                          for o in observed)
            prior = math.prod(1 / k for k in counts)
            assert at == pytest.approx((kernels + prior) / (n + 1), rel=1e-12)


def test_a_batch_at_the_start_holds_only_the_random_start_up_trials_tpe_would(toy):
    """With nothing measured, a batch of 16 holds TPE's 10 random start-up picks and 6 picks of
    the model (the prior against the picks in flight); the next batch, none random."""
    space, proposer = _proposer(toy)
    chosen = []

    class Counted:  # the proposer's generator, its random picks counted
        def __init__(self, rng):
            self.rng = rng

        def choice(self, n, size, replace):
            chosen.append(size)
            return self.rng.choice(n, size=size, replace=replace)

        def random(self, shape):
            return self.rng.random(shape)

    proposer._rng = Counted(proposer._rng)
    first = proposer.propose(observed=[], pending=[], count=16)
    assert len(first) == 16 and chosen == [10]
    second = proposer.propose(observed=[(first[0], 1.0)], pending=first[1:], count=4)
    assert len(second) == 4 and chosen == [10, 0]
    keys = {params_key(space.decode(p)) for p in first + second}
    assert len(keys) == 20


def test_the_batch_proposer_leans_to_the_good_region_once_it_has_seen_enough(toy):
    """Told the fastest configs have BLOCK_M=128, its picks favour BLOCK_M=128 over a uniform pick."""
    space, proposer = _proposer(toy)
    configs = valid_configs(toy)
    told = [(space.encode(c), 1.0 if c["BLOCK_M"] == 128 else 10.0) for c in configs[::2]]
    picks = proposer.propose(observed=told, pending=[], count=6)
    share = sum(space.decode(p)["BLOCK_M"] == 128 for p in picks) / len(picks)
    left = [c for c in configs[1::2]]
    uniform = sum(c["BLOCK_M"] == 128 for c in left) / len(left)
    assert share > uniform


def test_claims_and_results_in_batches_keep_the_lease_rules(url):
    repo = open_repository(url)
    device = {"name": "g", "sm_count": 1, "compute_capability": "9.0", "driver_version": "1", "cuda_version": "13.0"}

    def study_of(name, shape):
        return repo.open_study(name, family="toy", template_hash="h", space={"A": [1, 2, 3, 4, 5]}, shape=shape,
                               dtype="fp16", flags={}, device=device, sampler="tpe", replay=True, settings={})

    other = study_of("other", [2])  # rows of another study first: numbers are the study's own
    for number in repo.claim_trials(other.id, [{"A": 1}, {"A": 2}, {"A": 3}], owner="me:1"):
        repo.record_trial(other.id, number, {"A": 9}, TrialOutcome("ok", median_ms=3.0))
    study = study_of("s", [1])
    first = repo.claim_trial(study.id, {"A": 1}, owner="other:1")
    repo.record_trial(study.id, first, {"A": 1}, TrialOutcome("ok", median_ms=2.0), owner="other:1")
    repo.claim_trial(study.id, {"A": 2}, owner="h:999999")  # a live lease of another owner
    got = repo.claim_trials(study.id, [{"A": 1}, {"A": 2}, {"A": 3}, {"A": 3}, {"A": 4}, {"A": 5}],
                            owner="me:1", limit=4)
    assert [g.why if isinstance(g, ClaimRefused) else "granted" for g in got] == [
        "measured", "held", "granted", "held", "granted", "full"]
    three, four = got[2], got[4]
    assert (first, three, four) == (0, 2, 3)
    stored = repo.record_trials(study.id, [(three, {"A": 3}, TrialOutcome("ok", median_ms=1.0)),
                                           (four, {"A": 4}, TrialOutcome("failed", failure="wrong", reason="x"))],
                                owner="me:1")
    assert [s.number for s in stored] == [three, four]
    assert repo.best("toy", [1], "fp16", {}).median_ms == 1.0
    lost = repo.record_trials(study.id, [(three, {"A": 3}, TrialOutcome("ok", median_ms=0.5))], owner="me:1")
    assert isinstance(lost[0], ClaimRefused) and lost[0].why == "lost"
    assert sorted(t.number for t in repo.trials(study.id)) == sorted([first, three, four])


def test_a_trials_gpu_time_follows_the_workers_timing():
    timing = Timing(median_ms=0.02, min_ms=0.019, max_ms=0.021, iqr_ms=0.001, repetitions=200)
    ok = Measurement(ok=True, timing=timing)
    seconds, kernel, flush = gpu_time(ok)
    assert kernel == pytest.approx(WARMUP_S + 205 * 20e-6)
    assert flush == pytest.approx(200 * FLUSH_S)
    assert seconds == pytest.approx(kernel + flush + TRIAL_OVERHEAD_S)
    stopped, _, _ = gpu_time(ok, abort_above_ms=0.01)  # behind the bar: EARLY_REPS repetitions
    assert stopped == pytest.approx(WARMUP_S + (5 + EARLY_REPS) * 20e-6 + EARLY_REPS * FLUSH_S + TRIAL_OVERHEAD_S)
    assert gpu_time(Measurement.failed("screened", "spills")) == (0.0, 0.0, 0.0)
    assert gpu_time(Measurement.failed("wrong", "NaN"))[0] == TRIAL_OVERHEAD_S
    assert host_counts(128) == [64, 64] and host_counts(8) == [8] and sum(host_counts(100)) == 100
    assert busy_shares([(0, 1.0, 2.0), (1, 0.0, 5.0), (0, 2.5, 3.0)], 2, 1.0, 3.0) == [0.75, 1.0]
    # the steady state: from the last GPU's first start (1.0) to the first GPU's last end (3.0)
    assert steady_window([(0, 1.0, 2.0), (1, 0.0, 5.0), (0, 2.5, 3.0)], 2) == (1.0, 3.0)
    assert steady_window([(0, 1.0, 2.0)], 2) is None  # a GPU never measured: no steady state


def test_eight_simulated_gpus_through_ray_are_each_kept_busy_and_measured(url, tmp_path):
    result = tuner.tune(*SIMULATED, trials=48, replay=LANDSCAPE, db=url, seed=2, retime=0, warm_start=0,
                        simulate_gpus=8)
    assert result.status == "finished" and result.measured == 48
    throughput = result.throughput
    assert throughput.gpus == 8 and len(throughput.busy) == 8
    assert all(0 < share <= 1 for share in throughput.busy)  # every simulated GPU measured
    # the GPU time of the study's trials, spread over the 8: their busy time is what they measured
    busy_s = sum(throughput.busy) * throughput.wall_s
    assert busy_s == pytest.approx(result.gpu_busy_s, rel=0.02)
    assert 40 * 0.026 < result.gpu_busy_s < 48 * 0.05  # 27-48 ms a trial; a screened one takes none
    keys = _stored_keys(url, result.study)
    assert len(keys) == len(set(keys)) == 48


def test_a_hosts_measurements_are_posted_in_one_call_and_run_one_at_a_time_on_each_gpu():
    """The Mailbox against a real host actor: five measurements on two simulated GPUs go in one
    ``enqueue`` call; every result comes back through ``collect``, each GPU ran its own one at a
    time, and a collect with nothing finished waits its timeout and answers
    nothing."""
    import ray

    from workers.ray_session import start_ray, stop_ray
    from workers.replay import load_landscape
    from workers.mailbox import Mailbox
    from workers.request import pack
    from workers.simulate import RESOURCE, SimulatedGpu, SimulatedGpus

    landscape = load_landscape(LANDSCAPE, "attention")
    configs = [params for params, m in landscape.entries if m.ok][:5]
    start_ray(resources={RESOURCE: 2})
    try:
        host = ray.remote(SimulatedGpus).options(num_cpus=0, resources={RESOURCE: 2}).remote(
            LANDSCAPE, "attention", 2)
        gpus = [SimulatedGpu(host, 0), SimulatedGpu(host, 1)]
        mail = Mailbox(("attention",), None)

        def request(params):  # as the pool posts a measurement: a generation and a packed request
            return 0, pack(None, None, landscape.problem, params, {"seed": 0})

        letters = [mail.post(gpus[i % 2], *request(params)) for i, params in enumerate(configs)]
        mail.flush()
        got = {}
        while len(got) < len(letters):
            (ref,) = mail.collecting()
            for letter, measurement in mail.open(ray.get(ref, timeout=30), ref):
                got[letter.number] = measurement
        assert sorted(got) == sorted(letter.number for letter in letters)
        assert all(m.ok and m.gpu_seconds > 0.02 for m in got.values())
        intervals = ray.get(host.intervals.remote())
        for gpu in (0, 1):
            mine = [(a, b) for g, a, b in intervals if g == gpu]
            assert len(mine) == len(letters[gpu::2])
            assert all(end <= next_start + 1e-6 for (_, end), (next_start, _) in zip(mine, mine[1:])), intervals
        assert mail.collecting() == []  # nothing out: no collect
        began = time.monotonic()
        assert ray.get(host.collect.remote(0.2)) == [] and time.monotonic() - began >= 0.15
        # a collect sent ahead with a hold answers no sooner, and with what finished meanwhile
        letter = mail.post(gpus[0], *request(configs[0]))
        mail.flush()
        began = time.monotonic()
        (ref,) = mail.collecting(hold=0.5)
        assert mail.collecting(hold=0.5) == [ref]  # one a host
        ready, _ = ray.wait([ref], timeout=0.3)
        assert not ready  # the measurement took 30-50 ms; the collect holds
        ((opened, measurement),) = mail.open(ray.get(ref, timeout=30), ref)
        assert opened is letter and measurement.ok and time.monotonic() - began >= 0.45
    finally:
        stop_ray()


def test_simulated_gpus_without_a_replay_is_one_line(tmp_path, capsys):
    code = main(["tune", *SIMULATED[:1], "--shape", "4,8,512,64", "--dtype", "fp16", "--causal",
                 "--simulate-gpus", "8", "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and "--simulate-gpus needs --replay" in err and "Traceback" not in err
    assert not (tmp_path / "x.db").exists()


def test_a_batched_study_of_the_whole_space_stops_when_every_valid_config_is_measured(toy, db, pools):
    result = tuner.tune("toy", *PROBLEM, trials=500, db=db, seed=0, warm_start=0)
    valid = len(valid_configs(toy))
    assert result.status == "finished" and result.measured == valid
    assert result.reason == f"every valid config ({valid}) measured"
    keys = _stored_keys(db, result.study)
    assert len(keys) == len(set(keys)) == valid
