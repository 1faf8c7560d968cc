"""The Optuna side of a study: its name, its sampler, its space and how results are told.

One Optuna study exists per (family, template version, problem, GPU); its name is readable and
deterministic, so running the same command again resumes it::

    from tuner.search import SearchSpace, make_sampler, open_study, study_name

    name = study_name("attention", "3f9a0c1d2e4b5a6c", problem, "NVIDIA H100 80GB HBM3")
    # 'attention/4x16x4096x128-fp16-causal/H100-80GB-HBM3/3f9a0c1d2e4b5a6c'
    space = SearchSpace(family.params)
    study = open_study(name, "sqlite:///tuner.db", make_sampler("tpe", space, seed=0))
    trial = study.ask(space.distributions)
    params = space.decode(trial.params)

Failures are scored like Triton's autotuner does: a config that fails to compile, run or
validate is told as a COMPLETE trial with the value ``inf`` (:data:`FAILED_VALUE`). TPE only
learns from COMPLETE and PRUNED trials; a FAIL trial is invisible to it, so it keeps proposing
the failing region (``tests/tuner/test_search.py`` measures the difference).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import re
import socket
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from templates.family import Param, Problem
from tuner.errors import DatabaseError, UsageError

SAMPLERS = ("tpe", "random", "grid")
FAILED_VALUE = float("inf")  # the objective of a config that failed or cannot run
N_STARTUP_TRIALS = 10

_OPTUNA_TYPES = (type(None), bool, int, float, str)


def gpu_slug(device_name: str) -> str:
    """``'NVIDIA H100 80GB HBM3'`` -> ``'H100-80GB-HBM3'`` (safe in a study name)."""
    name = re.sub(r"^NVIDIA\s+", "", device_name.strip())
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "unknown-gpu"


def study_name(
    family: str, template_hash: str, problem: Problem, device_name: str, *, replay: bool = False
) -> str:
    """The study of one family version, problem and GPU model (replayed studies are apart)."""
    name = f"{family}/{problem.key}/{gpu_slug(device_name)}/{template_hash}"
    return name + "/replay" if replay else name


class SearchSpace:
    """A family's parameters as Optuna categorical distributions, and back.

    Optuna categoricals hold ``None``, ``bool``, ``int``, ``float`` or ``str``; any other choice
    (a tuple, say) is shown to Optuna as its ``repr`` and decoded back to the original value.
    A parameter with one choice (a replayed landscape's space, recorded before the parameter
    existed) is no dimension of the search: Optuna never sees it, ``decode`` adds it. (Shown to
    TPE, five such parameters left one seed of a replay asking 2,000 proposals in 6 minutes.)
    """

    def __init__(self, params: Sequence[Param]) -> None:
        self.params = tuple(params)
        self._to_optuna: dict[str, dict[Any, Any]] = {}
        self._from_optuna: dict[str, dict[Any, Any]] = {}
        for param in self.params:
            encode = {}
            for choice in param.choices:
                encode[_hashable(choice)] = choice if type(choice) in _OPTUNA_TYPES else repr(choice)
            self._to_optuna[param.name] = encode
            self._from_optuna[param.name] = {v: c for v, c in zip(encode.values(), param.choices)}
        self.fixed = {p.name: p.choices[0] for p in self.params if len(p.choices) == 1}
        self.distributions: dict[str, CategoricalDistribution] = {
            p.name: CategoricalDistribution(list(self._to_optuna[p.name].values()))
            for p in self.params if p.name not in self.fixed
        }

    @property
    def size(self) -> int:
        return math.prod(len(p.choices) for p in self.params)

    def grid(self) -> dict[str, list[Any]]:
        """The full categorical space, as :class:`optuna.samplers.GridSampler` wants it."""
        return {name: list(dist.choices) for name, dist in self.distributions.items()}

    def contains(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` names exactly this space's parameters, each at one of its choices."""
        return set(params) == set(self._to_optuna) and all(
            _hashable(value) in self._to_optuna[name] for name, value in params.items())

    def configs(self) -> Iterator[dict[str, Any]]:
        """Every point of the space, in a fixed order."""
        names = [p.name for p in self.params]
        for values in itertools.product(*(p.choices for p in self.params)):
            yield dict(zip(names, values))

    def encode(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self._to_optuna[name][_hashable(value)] for name, value in params.items()
                if name not in self.fixed}

    def decode(self, optuna_params: Mapping[str, Any]) -> dict[str, Any]:
        return {p.name: self.fixed[p.name] if p.name in self.fixed else self._from_optuna[p.name][optuna_params[p.name]]
                for p in self.params}


def _hashable(value: Any) -> Any:
    return (type(value).__name__, repr(value))


def make_sampler(kind: str, space: SearchSpace, seed: int | None = None,
                 points: Sequence[Mapping[str, Any]] | None = None,
                 valid: Callable[[dict[str, Any]], bool] | None = None) -> optuna.samplers.BaseSampler:
    """``tpe`` (multivariate, constant liar for trials in flight), ``random`` or ``grid``.
    A grid given ``points`` (the family's valid configs) walks those alone, in random order;
    without, it walks the whole product of the parameters' choices. TPE given ``valid`` (the
    family's constraints, on decoded params) prefers the candidates they accept."""
    if kind == "tpe":
        options = dict(seed=seed, multivariate=True, n_startup_trials=N_STARTUP_TRIALS,
                       constant_liar=True)
        if valid is None:
            return optuna.samplers.TPESampler(**options)
        return _ConstrainedTPESampler(space, valid, **options)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid" and points is not None:
        return _PointsSampler([space.encode(point) for point in points], seed=seed)
    if kind == "grid":
        return _GridSampler(space.grid(), seed=seed)
    raise UsageError(f"unknown sampler {kind!r} (choose from {', '.join(SAMPLERS)})")


class _ConstrainedTPESampler(optuna.samplers.TPESampler):
    """TPE that ranks the configs the family rejects last, and those measured already (or being
    measured) below every new one. An ask of multivariate TPE draws 24 candidates from the
    density of the good trials and proposes the one that is most likely good rather than bad;
    here an ask proposes an invalid config only when all 24 are, and a repeat only when all 24
    are invalid or known. Plain TPE learned the invalid region from ``inf`` results, one ask at a
    time (2-3 rejected asks per measured trial), and proposed a config it had measured about twice
    for each new one late in a study; a repeat costs the GPU nothing, but each ask costs the
    coordinator about 10 ms. (The hooks are Optuna's ``_sample`` and
    ``_compute_acquisition_func``; Optuna is pinned below 6.)"""

    REPEAT_PENALTY = 1e12  # below any new valid candidate's acquisition value, above -inf

    def __init__(self, space: SearchSpace, valid: Callable[[dict[str, Any]], bool], **options: Any) -> None:
        super().__init__(**options)
        self._space, self._valid = space, valid
        self._taken: set[tuple[Any, ...]] = set()

    def _sample(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]) -> dict[str, Any]:
        names = list(self._space.distributions)
        others = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING),
                                   use_cache=False)
        self._taken = {tuple(t.params.get(n) for n in names) for t in others if t.number != trial.number}
        return super()._sample(study, trial, search_space)

    def _compute_acquisition_func(self, samples: dict[str, np.ndarray], mpe_below: Any,
                                  mpe_above: Any) -> np.ndarray:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        distributions = self._space.distributions
        if samples.keys() != distributions.keys():  # only part of the space is sampled jointly
            return values
        for i in range(values.size):
            encoded = {name: distributions[name].choices[int(samples[name][i])] for name in distributions}
            if not self._valid(self._space.decode(encoded)):
                values[i] = -np.inf
            elif tuple(encoded.values()) in self._taken:
                values[i] -= self.REPEAT_PENALTY
        return values


class _GridSampler(optuna.samplers.GridSampler):
    """GridSampler whose ``after_trial`` does not call ``study.stop()``: outside ``optimize``
    (ask/tell) that raises; the coordinator stops by itself once every valid config is measured."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        return None


class _PointsSampler(optuna.samplers.BaseSampler):
    """A grid over a list of points: each trial takes the first point (in a shuffled order) whose
    params no trial of the study has, so a resumed or shared study goes on where it was. Once
    every point is taken it repeats random ones; the coordinator stops first.
    Optuna's GridSampler walks the whole product, and the attention space's is 3.5 times its valid
    configs: each rejected point cost an ask and a tell."""

    def __init__(self, points: Sequence[Mapping[str, Any]], seed: int | None = None) -> None:
        self._points = [dict(point) for point in points]
        self._keys = [_point_key(point) for point in self._points]
        self._order = list(range(len(self._points)))
        self._rng = random.Random(seed)
        self._rng.shuffle(self._order)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs or not self._points:  # enqueued: its own params
            return
        taken = {_point_key(t.params) for t in study.get_trials(deepcopy=False) if t.params}
        index = next((i for i in self._order if self._keys[i] not in taken), None)
        if index is None:
            index = self._rng.randrange(len(self._points))
        study._storage.set_trial_system_attr(trial._trial_id, "point", index)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        index = trial.system_attrs.get("point")
        if index is None:  # an enqueued trial's parameter outside its fixed ones: any point's
            return self._points[0][param_name] if self._points else param_distribution.choices[0]
        return self._points[index][param_name]


def _point_key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage at ``url``; on SQLite its connections get our pragmas (WAL, synced at
    checkpoints: ``storage.engine.use_sqlite_pragmas``)."""
    from storage.engine import use_sqlite_pragmas  # SQLAlchemy: imported when a database opens

    storage = optuna.storages.RDBStorage(url)
    use_sqlite_pragmas(storage.engine)  # the connections Optuna opened for its tables: made anew
    return storage


def open_study(name: str, url: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create the Optuna study in the database at ``url``, or load it to resume."""
    try:
        storage = optuna_storage(url)
        return optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            direction="minimize",
            load_if_exists=True,
        )
    except Exception as error:  # driver, SQLAlchemy and Optuna errors alike
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DatabaseError(f"cannot open the Optuna study {name!r} in {url}: {first}") from None


# -- several coordinators on one study (PostgreSQL shared by several machines) ------------------
STALE_AFTER_S = 3600.0  # a RUNNING trial of another host is presumed orphaned after this


def owner_id() -> str:
    """Who is measuring a trial: ``host:pid`` of this coordinator."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str | None, started: datetime | None, now: datetime | None = None) -> bool:
    """Whether the coordinator that asked a RUNNING trial may still tell it.

    On this host the process is asked directly (this process itself counts as gone: an earlier
    run in it has already settled what it could); another host's trial is presumed alive until
    ``STALE_AFTER_S`` after it started. A trial with no owner comes from an older version: gone.
    """
    if not owner or ":" not in owner:
        return False
    host, _, pid_text = owner.rpartition(":")
    if host == socket.gethostname():
        try:
            pid = int(pid_text)
        except ValueError:
            return False
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if started is None:
        return False
    now = now or datetime.now(started.tzinfo)
    return (now - started).total_seconds() < STALE_AFTER_S


def abandon(study: optuna.Study, number: int, params: Mapping[str, Any] | None) -> None:
    """Mark a trial that will never be told as FAIL; queue its params to be asked first again."""
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    if params is not None and not _is_waiting(study, params):
        study.enqueue_trial(dict(params))


def _is_waiting(study: optuna.Study, params: Mapping[str, Any]) -> bool:
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if trial.system_attrs.get("fixed_params") == dict(params):
            return True
    return False


def orphans(study: optuna.Study) -> list[FrozenTrial]:
    """Trials asked but never told: left RUNNING by a run that was killed."""
    return list(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def resume_seed(seed: int | None, study: optuna.Study) -> int | None:
    """A resumed study should not replay its first random proposals: shift the seed."""
    return None if seed is None else seed + len(study.get_trials(deepcopy=False))
