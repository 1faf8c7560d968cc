"""The Optuna side of a study: its name, its sampler, its space and how results are told.

One study exists per (family, template version, problem, GPU); its name is readable and
deterministic, so running the same command again resumes it. Its trials are stored in our tables
(``storage``); the sampler works on an in-memory Optuna study, rebuilt from them on resume::

    from tuner.study.search import SearchSpace, make_sampler, memory_study, stored_trial, study_name

    name = study_name("attention", "3f9a0c1d2e4b5a6c", problem, "NVIDIA H100 80GB HBM3")
    # 'attention/4x16x4096x128-fp16-causal/H100-80GB-HBM3/3f9a0c1d2e4b5a6c'
    space = SearchSpace(family.params)
    study = memory_study(make_sampler("tpe", space, seed=0))
    study.add_trials([stored_trial(space, t.params, objective(t)) for t in repo.trials(id)])
    trial = study.ask(space.distributions)
    params = space.decode(trial.params)

Only Optuna's public API is used (``create_study``, ``ask``/``tell``, ``enqueue_trial``,
``add_trial``, the samplers' public methods).

Failures are scored like Triton's autotuner does: a config that fails to compile, run or
validate is told as a COMPLETE trial with the value ``inf`` (:data:`FAILED_VALUE`). TPE only
learns from COMPLETE and PRUNED trials; a FAIL trial is invisible to it, so it keeps proposing
the failing region (``tests/tuner/test_search.py`` measures the difference).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import random
import re
import socket
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping, Sequence

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from storage import LEASE_TTL_S
from templates.family import DeviceLimits, KernelFamily, Param, Problem
from tuner.errors import UsageError

SAMPLERS = ("tpe", "optuna-tpe", "random", "grid")
RENAMED = {"tpe-batch": "tpe"}  # a sampler's name before, and its name now
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


def valid_in_space(family: KernelFamily, problem: Problem, limits: DeviceLimits,
                   space: SearchSpace, *, listed: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The family's valid configs for ``problem`` that ``space`` holds (a replayed landscape's
    space may lack some): what the samplers propose among, listed once a study. ``listed``: the
    family's valid configs where the caller has them already (not listed again)."""
    if listed is None:
        listed = family.valid_configs(problem, limits)
    return [c for c in listed if space.contains(c)]


_SCALARS = (int, str, bool, float, type(None))


@functools.lru_cache(maxsize=4096, typed=True)  # typed: 1, 1.0 and True keep their own keys
def _scalar_key(value: Any) -> str:
    """A plain scalar choice's JSON text, computed once."""
    return json.dumps(value)


def _hashable(value: Any) -> Any:
    """A choice's key: its JSON text, so that a tuple choice read back from the database as a
    list is the same choice; a value JSON cannot hold, by its type and repr. A plain scalar's
    key is computed once (:func:`_scalar_key`)."""
    if type(value) in _SCALARS:
        return _scalar_key(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return (type(value).__name__, repr(value))


def make_sampler(kind: str, space: SearchSpace, seed: int | None = None,
                 points: Sequence[Mapping[str, Any]] | None = None,
                 valid: Callable[[dict[str, Any]], bool] | None = None,
                 constant_liar: bool = True) -> optuna.samplers.BaseSampler:
    """``tpe`` (the default: TPE's estimator, whose coordinator proposes a batch at once from one
    model, :mod:`tuner.study.batchtpe`), ``optuna-tpe`` (Optuna's multivariate TPE asked one config at a
    time), ``random`` or ``grid``; both TPEs count the trials in flight as bad results unless
    ``constant_liar=False``. A ``tpe`` study's sampler is Optuna's TPE too: it asks the configs
    enqueued (warm start, settled trials) with their own params.
    A grid given ``points`` (the family's valid configs) walks those alone, in random order;
    without, it walks the whole product of the parameters' choices. TPE given ``valid`` (the
    family's constraints, on decoded params) prefers the candidates they accept; given
    ``points`` too, it proposes valid configs alone, its random start-up trials among them.
    ``random`` given ``points`` draws among them (uniformly, repeats included)."""
    kind = RENAMED.get(kind, kind)
    if kind in ("tpe", "optuna-tpe"):
        options = dict(seed=seed, multivariate=True, n_startup_trials=N_STARTUP_TRIALS,
                       constant_liar=constant_liar)
        if valid is None and points is None and kind == "optuna-tpe":
            return optuna.samplers.TPESampler(**options)
        sampler = _ConstrainedTPESampler(space, valid or (lambda params: True), points, **options)
        sampler.batch_proposals = kind == "tpe"
        return sampler
    if kind == "random" and points is not None:
        return _ValidRandomSampler([space.encode(point) for point in points], space.distributions,
                                   seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid" and points is not None:
        return _PointsSampler([space.encode(point) for point in points], space.distributions,
                              seed=seed)
    if kind == "grid":
        return _GridSampler(space.grid(), seed=seed)
    raise UsageError(f"unknown sampler {kind!r} (choose from {', '.join(SAMPLERS)})")


class _ConstrainedTPESampler(optuna.samplers.TPESampler):
    """TPE that passes over the configs the family rejects and those measured already (or being
    measured): an ask draws TPE's proposal again, up to ``DRAWS`` times, until one is valid and
    new; else the new valid config nearest (in parameters changed) the first valid draw, or the
    last draw when none was valid; else that first valid draw (a repeat). Each draw is TPE's own (multivariate TPE
    draws 24 candidates from the density of the good trials and proposes the likeliest good
    one); the random start-up trials are not redrawn. Plain TPE learned the invalid region from
    ``inf`` results, one ask at a time (2-3 rejected asks per measured trial), and proposed a
    config it had measured about twice for each new one late in a study; a repeat costs the GPU
    nothing, but each ask costs the coordinator about 10 ms.

    Given the valid configs (``points``, which a study lists once), every proposal is one of them:
    the random start-up trials are drawn among them, and a TPE proposal none of whose draws was
    valid and new is replaced by the nearest valid new config. Without them, past ``SCAN_LIMIT``
    configs, neither holds: in attention's space of 7.3 million configs (0.02% valid for
    4x16x4096x128) a live study told 640 rejected start-up configs as ``inf`` in its first 90
    seconds, each ask slower than the last (60-170 ms), while the GPU measured 11 configs.
    (Only public hooks: ``infer_relative_search_space``, ``sample_relative`` and
    ``Study.get_trials``.)"""

    DRAWS = 16
    SCAN_LIMIT = 100_000  # configs scanned for a valid one when every draw was invalid

    def __init__(self, space: SearchSpace, valid: Callable[[dict[str, Any]], bool],
                 points: Sequence[Mapping[str, Any]] | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._space, self._valid = space, valid
        names = list(space.distributions)
        self._points: list[tuple[Any, ...]] | None = None if points is None else [
            tuple(encoded[n] for n in names) for encoded in map(space.encode, points)]
        self._given = points is not None
        self._start_rng = random.Random(options.get("seed"))
        self.batch_seed = options.get("seed")  # for tuner.study.batchtpe.BatchProposer
        self.constant_liar = bool(options.get("constant_liar"))
        self.batch_proposals = False  # the coordinator proposes in batches (sampler "tpe")

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        """The whole space where the valid configs are given (a start-up trial is one of them,
        drawn by :meth:`sample_relative`); else TPE's own."""
        if self._given:
            return dict(self._space.distributions)
        return super().infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        names = list(self._space.distributions)
        others = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        taken = {tuple(t.params.get(n) for n in names) for t in others if t.number != trial.number}
        first_valid: dict[str, Any] | None = None
        params: dict[str, Any] = {}
        for _ in range(self.DRAWS):
            params = super().sample_relative(study, trial, search_space)
            if params.keys() != self._space.distributions.keys():  # start-up, or part of the space
                return self._random_valid(taken) if self._given and search_space else params
            if not self._valid(self._space.decode(params)):
                continue
            if tuple(params[n] for n in names) not in taken:
                return params
            first_valid = first_valid or params
        nearest = self._nearest_valid(first_valid or params, taken)
        if nearest is not None and (first_valid is None or tuple(nearest[n] for n in names) not in taken):
            return nearest
        return first_valid or params

    def _nearest_valid(self, params: dict[str, Any], taken: set[tuple[Any, ...]]) -> dict[str, Any] | None:
        """The valid config (a new one if any) that differs from ``params`` in the fewest
        parameters; None in a space past ``SCAN_LIMIT`` configs. The space's valid configs are
        listed once (:meth:`_valid_points`): checked on every call, the scan took 190 ms an ask
        late in a 200-trial attention study, more than TPE's draws."""
        points = self._valid_points()
        if points is None:
            return None
        names = list(self._space.distributions)
        target = tuple(params[n] for n in names)
        best: tuple[bool, int] | None = None
        nearest = None
        for point in points:
            rank = (point in taken, sum(a != b for a, b in zip(point, target)))
            if best is None or rank < best:
                best, nearest = rank, point
        return None if nearest is None else dict(zip(names, nearest))

    def _random_valid(self, taken: set[tuple[Any, ...]]) -> dict[str, Any]:
        """A start-up trial: a valid config none has taken (any valid one once all are), uniformly."""
        assert self._points is not None
        new = [point for point in self._points if point not in taken] or self._points
        if not new:  # no valid config at all: TPE's random draw, which the family then rejects
            return {}
        return dict(zip(self._space.distributions, self._start_rng.choice(new)))

    def _valid_points(self) -> list[tuple[Any, ...]] | None:
        """The space's valid configs, encoded, in the space's order (None past ``SCAN_LIMIT``)."""
        if self._points is None and self._space.size <= self.SCAN_LIMIT:
            names = list(self._space.distributions)
            self._points = [tuple(self._space.encode(c)[n] for n in names)
                            for c in self._space.configs() if self._valid(c)]
        return self._points


class _GridSampler(optuna.samplers.GridSampler):
    """GridSampler whose ``after_trial`` does not call ``study.stop()``: outside ``optimize``
    (ask/tell) that raises; the coordinator stops by itself once every valid config is measured."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        return None


class _PointsSampler(optuna.samplers.BaseSampler):
    """A grid over a list of points: each trial takes the first point (in a shuffled order) whose
    params no trial of the study has, so a resumed or shared study goes on where it was. Once
    every point is taken it repeats random ones; the coordinator stops first. An enqueued
    trial keeps its own params (Optuna gives fixed params precedence over relative ones).
    Optuna's GridSampler walks the whole product, and the attention space's is 3.5 times its valid
    configs: each rejected point cost an ask and a tell."""

    def __init__(self, points: Sequence[Mapping[str, Any]], distributions: Mapping[str, Any],
                 seed: int | None = None) -> None:
        self._points = [dict(point) for point in points]
        self._keys = [_point_key(point) for point in self._points]
        self._distributions = dict(distributions)
        self._order = list(range(len(self._points)))
        self._rng = random.Random(seed)
        self._rng.shuffle(self._order)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return dict(self._distributions) if self._points else {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        if not self._points or not search_space:
            return {}
        taken = {_point_key(t.params) for t in study.get_trials(deepcopy=False)
                 if t.params and t.number != trial.number}
        index = next((i for i in self._order if self._keys[i] not in taken), None)
        if index is None:
            index = self._rng.randrange(len(self._points))
        return {name: self._points[index][name] for name in search_space if name in self._points[index]}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        """A parameter outside the points' (none in the coordinator's use): the first point's."""
        if self._points and param_name in self._points[0]:
            return self._points[0][param_name]
        return param_distribution.choices[0]


class _ValidRandomSampler(optuna.samplers.RandomSampler):
    """Random search among a list of points (the family's valid configs), each drawn with equal
    chance, repeats included. Optuna's RandomSampler draws from the whole product: in attention's
    space one draw in 5,000 is valid, so a study would meet the loop's limit of 500 rejected asks
    in a row (``options.MAX_IDLE_ASKS``) before its first few trials."""

    def __init__(self, points: Sequence[Mapping[str, Any]], distributions: Mapping[str, Any],
                 seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self._points = [dict(point) for point in points]
        self._distributions = dict(distributions)
        self._draw = random.Random(seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return dict(self._distributions) if self._points else {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        if not search_space:
            return {}
        return dict(self._draw.choice(self._points))


def _point_key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def memory_study(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """The sampler's study: in memory, minimizing; its trials come from our tables."""
    return optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=sampler,
                               direction="minimize")


def stored_trial(space: SearchSpace, params: Mapping[str, Any], value: float) -> FrozenTrial | None:
    """A stored trial (decoded ``params``, objective ``value``) as a COMPLETE trial of the
    sampler's study; None when its params are not of ``space`` (a replay's narrower space)."""
    if not space.contains(params):
        return None
    return optuna.trial.create_trial(params=space.encode(params), distributions=space.distributions,
                                     value=value)


# -- several coordinators on one study (one machine, or PostgreSQL shared by several) -------------
def owner_id() -> str:
    """Who is measuring a trial: ``host:pid`` of this coordinator."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str | None, heartbeat: datetime | None, now: datetime | None = None) -> bool:
    """Whether the coordinator holding a running trial's lease may still tell it.

    A lease not renewed for ``storage.LEASE_TTL_S`` (its owner renews every ``LEASE_RENEW_S``
    while it measures) is stale, whoever holds it. Within that time, on this host the process is
    asked directly, so a coordinator killed with ``kill -9`` is known gone at once (this process
    itself counts as gone: an earlier run in it has already settled what it could); another
    host's is presumed alive. A trial with no owner was left by a run that stopped: gone.
    """
    if not owner or ":" not in owner or heartbeat is None:
        return False
    now = now or datetime.now(heartbeat.tzinfo)
    if (now - heartbeat).total_seconds() >= LEASE_TTL_S:
        return False
    host, _, pid_text = owner.rpartition(":")
    if host != socket.gethostname():
        return True
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


def resume_seed(seed: int | None, stored: int) -> int | None:
    """A resumed study (``stored`` trials) should not replay its first random proposals: shift
    the seed."""
    return None if seed is None else seed + stored
