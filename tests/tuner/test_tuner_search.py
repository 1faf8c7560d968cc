"""Study naming, the search space mapping, samplers, and how failures are scored."""

from __future__ import annotations

import warnings

import optuna
import pytest
from optuna.trial import TrialState

from templates.family import Param, Problem
from tuner.errors import UsageError
from tuner.study import search


def test_study_name_is_readable_and_deterministic():
    problem = Problem((4, 16, 4096, 128), "fp16", (("causal", True),))
    name = search.study_name("attention", "3f9a0c1d2e4b5a6c", problem, "NVIDIA H100 80GB HBM3")
    assert name == "attention/4x16x4096x128-fp16-causal/H100-80GB-HBM3/3f9a0c1d2e4b5a6c"
    assert name == search.study_name("attention", "3f9a0c1d2e4b5a6c", problem, "NVIDIA H100 80GB HBM3")
    other = search.study_name("attention", "3f9a0c1d2e4b5a6c", Problem((4, 16, 4096, 128), "fp16"),
                              "NVIDIA H200")
    assert other == "attention/4x16x4096x128-fp16/H200/3f9a0c1d2e4b5a6c"
    assert search.study_name("attention", "h", problem, "NVIDIA H200", replay=True).endswith("/replay")


def test_space_round_trips_values_optuna_cannot_hold():
    space = search.SearchSpace((Param("TILE", ((64, 64), (128, 64))), Param("SWIZZLE", (True, False)),
                                Param("K", (1, 2.5, "x", None))))
    assert space.size == 16
    for params in ({"TILE": (128, 64), "SWIZZLE": False, "K": None},
                   {"TILE": (64, 64), "SWIZZLE": True, "K": 2.5}):
        assert space.decode(space.encode(params)) == params
    assert space.distributions["TILE"].choices == ("(64, 64)", "(128, 64)")
    study = optuna.create_study()
    trial = study.ask(space.distributions)
    assert space.decode(trial.params)["TILE"] in ((64, 64), (128, 64))


@pytest.mark.parametrize("kind, cls", [("tpe", optuna.samplers.TPESampler),
                                       ("random", optuna.samplers.RandomSampler),
                                       ("grid", optuna.samplers.GridSampler)])
def test_make_sampler(kind, cls):
    space = search.SearchSpace((Param("A", (1, 2)), Param("B", ("x", "y"))))
    assert isinstance(search.make_sampler(kind, space, seed=0), cls)


def test_unknown_sampler_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown sampler 'cmaes'"):
        search.make_sampler("cmaes", search.SearchSpace((Param("A", (1,)),)))


def test_grid_sampler_in_ask_tell_visits_each_point_once():
    space = search.SearchSpace((Param("A", (1, 2, 3)), Param("B", ("x", "y"))))
    study = optuna.create_study(sampler=search.make_sampler("grid", space, seed=0))
    seen = []
    for _ in range(space.size):
        trial = study.ask(space.distributions)
        seen.append(tuple(sorted(trial.params.items())))
        study.tell(trial, 1.0)  # Optuna's GridSampler would raise here on the last point
    assert len(set(seen)) == space.size


def test_a_grid_over_points_visits_each_once_and_resumes_where_it_was():
    space = search.SearchSpace((Param("A", (1, 2, 3)), Param("B", ("x", "y"))))
    points = [dict(A=1, B="x"), dict(A=3, B="y"), dict(A=2, B="y")]  # not a product
    assert isinstance(search.make_sampler("grid", space, seed=0, points=points), search._PointsSampler)
    study = optuna.create_study(sampler=search.make_sampler("grid", space, seed=0, points=points))
    first = space.decode(study.ask(space.distributions).params)
    study.tell(study.trials[-1].number, 1.0)
    study.sampler = search.make_sampler("grid", space, seed=5, points=points)  # a resumed run
    rest = []
    for _ in range(2):
        trial = study.ask(space.distributions)
        rest.append(space.decode(trial.params))
        study.tell(trial, 1.0)
    assert sorted([first, *rest], key=str) == sorted(points, key=str)
    study.enqueue_trial(space.encode(dict(A=2, B="x")))  # an enqueued trial keeps its params
    assert space.decode(study.ask(space.distributions).params) == dict(A=2, B="x")


def _failures_after_startup(mode: str, seed: int, n: int = 30) -> int:
    """How often TPE proposes a failing config after its random start-up trials."""
    space = search.SearchSpace((Param("A", (16, 32, 64, 128)), Param("B", (1, 2, 4, 8)),
                                Param("C", (0, 1, 2))))
    study = optuna.create_study(sampler=search.make_sampler("tpe", space, seed=seed))
    failures = 0
    for i in range(n):
        trial = study.ask(space.distributions)
        p = trial.params
        if p["A"] == 128 or p["B"] == 8:  # the failing region
            failures += i >= search.N_STARTUP_TRIALS
            if mode == "inf":
                study.tell(trial, search.FAILED_VALUE)
            else:
                study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, 1.0 + abs(p["A"] - 64) / 64 + abs(p["B"] - 4) / 4 + 0.1 * p["C"])
    return failures


def test_tpe_learns_to_avoid_failures_told_as_inf_not_as_fail():
    """Why failures are COMPLETE trials valued inf: TPE ignores FAIL trials and keeps proposing
    the failing region; scored inf they fall in the 'bad' group it steers away from."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        as_inf = sum(_failures_after_startup("inf", seed) for seed in range(4))
        as_fail = sum(_failures_after_startup("fail", seed) for seed in range(4))
    assert as_inf * 2 < as_fail, (as_inf, as_fail)


def test_tpe_told_the_constraints_proposes_few_invalid_configs():
    space = search.SearchSpace((Param("A", tuple(range(8))), Param("B", tuple(range(8))),
                                Param("C", ("x", "y"))))

    def valid(params):  # a quarter of the space, like a tile that must fit its warps
        return params["A"] % 2 == 0 and params["B"] % 2 == 0

    def invalid_asks(sampler):
        study = optuna.create_study(sampler=sampler)
        count = 0
        for _ in range(80):
            trial = study.ask(space.distributions)
            params = space.decode(trial.params)
            ok = valid(params)
            count += not ok
            study.tell(trial, params["A"] + params["B"] if ok else float("inf"))
        return count

    plain = invalid_asks(search.make_sampler("tpe", space, seed=1))
    told = invalid_asks(search.make_sampler("tpe", space, seed=1, valid=valid))
    assert isinstance(search.make_sampler("tpe", space, valid=valid), optuna.samplers.TPESampler)
    assert told <= search.N_STARTUP_TRIALS  # only the random start-up trials can miss
    assert plain > 2 * told


def test_tpe_given_the_valid_configs_of_a_sparse_space_proposes_only_new_valid_ones():
    """A space past the scan limit where one config in 4,096 is valid (attention's is one in
    5,000): given the valid configs, the start-up trials and TPE's proposals are all valid and
    new, with the constant liar's trials in flight; without them most start-up trials miss.
    Random search given them draws among them."""
    space = search.SearchSpace(tuple(Param(name, tuple(range(8))) for name in "ABCDEFG"))
    assert space.size > search._ConstrainedTPESampler.SCAN_LIMIT

    def valid(params):
        return (params["A"] == params["B"] == params["C"] and params["D"] + params["E"] == 7
                and params["F"] == params["G"])

    points = [dict(A=a, B=a, C=a, D=d, E=7 - d, F=f, G=f) for a in range(8) for d in range(8)
              for f in range(8)]
    assert all(map(valid, points)) and len(points) * 4096 == space.size

    def asks(sampler, count=40, in_flight=8):
        study = optuna.create_study(sampler=sampler)
        proposed, flight = [], []
        for _ in range(count):
            trial = study.ask(space.distributions)
            params = space.decode(trial.params)
            proposed.append(params)
            if not valid(params):
                study.tell(trial, float("inf"))
                continue
            flight.append((trial, params))
            if len(flight) > in_flight:
                done, p = flight.pop(0)
                study.tell(done, 1.0 + abs(p["A"] - 5) + abs(p["F"] - 2) + 0.1 * p["G"])
        return proposed

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        given = asks(search.make_sampler("tpe", space, seed=3, points=points, valid=valid))
        blind = asks(search.make_sampler("tpe", space, seed=3, valid=valid), count=search.N_STARTUP_TRIALS)
    assert all(valid(p) for p in given)
    assert len({tuple(p.values()) for p in given}) == len(given)
    assert sum(not valid(p) for p in blind) >= search.N_STARTUP_TRIALS - 1
    drawn = asks(search.make_sampler("random", space, seed=3, points=points), count=60)
    assert all(valid(p) for p in drawn) and len({tuple(p.values()) for p in drawn}) > 50


def test_a_parameter_with_one_choice_is_no_dimension_of_the_search():
    space = search.SearchSpace((Param("TILE", (64, 128)), Param("LOADS", ("cp.async",)), Param("K", (1, 2))))
    assert set(space.distributions) == {"TILE", "K"} and space.fixed == {"LOADS": "cp.async"}
    assert space.size == 4 and len(list(space.configs())) == 4
    assert space.decode({"TILE": 128, "K": 2}) == {"TILE": 128, "LOADS": "cp.async", "K": 2}
    assert space.encode({"TILE": 128, "LOADS": "cp.async", "K": 2}) == {"TILE": 128, "K": 2}
    assert space.contains({"TILE": 64, "LOADS": "cp.async", "K": 1})
    assert not space.contains({"TILE": 64, "LOADS": "tma", "K": 1})  # a choice it does not hold
    assert not space.contains({"TILE": 64, "K": 1})  # a parameter missing
