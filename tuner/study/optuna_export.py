"""Our stored trials as Optuna's, for optuna-dashboard and Optuna's own tools.

Our tables are the record of a study; the sampler works in memory. Optuna's view of a study is
derived from them, in two places:

- in our own database, kept up to date while a study runs (:mod:`tuner.study.dashboard`), so that
  ``optuna-dashboard sqlite:///tuner.db`` shows every study as it is measured;
- copied on demand to another storage::

    tuner.export_optuna(name, "study.log")              # a journal file
    tuner.export_optuna(name, "sqlite:///optuna.db")    # or any Optuna RDB URL
    # then: optuna-dashboard study.log   (or: optuna-dashboard sqlite:///optuna.db)

Each stored trial becomes one Optuna trial: an ok one COMPLETE with its median (ms), a failed
one FAIL (never ``inf``: that is the sampler's own view of a failure, :mod:`tuner.study.search`); the
stored number, failure kind and reason, TFLOPS and GPU state travel as user attributes. The
objective is named :data:`METRIC`; the study carries its problem, GPU, template version and
family as user attributes (:func:`study_attrs`). Every parameter is categorical over the choices
the study's space stored (values Optuna cannot hold, such as lists, as their ``repr``). Only
Optuna's public API is used.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from storage import ranked_ms
from templates.family import Problem

METRIC = "median_ms"  # the objective's name, as optuna-dashboard labels it
COPY_MARK = "tuner_study_id"  # a study user attribute: this Optuna study is a copy of ours
_OPTUNA_TYPES = (type(None), bool, int, float, str)
_USER_ATTRS = ("failure", "reason", "tflops", "registers", "spill_stores", "cubin_hash", "toolkit",
               "iqr_ms", "repetitions", "replayed", "gpu_state", "median_ms", "gpu_uuid",
               "gpu_index", "gpu_ratio")


def optuna_storage(target: str) -> optuna.storages.BaseStorage:
    """``target`` as an Optuna storage: a URL (``sqlite:///...``, ``postgresql://...``) as an
    RDB storage, anything else as the path of a journal file."""
    if "://" in target:
        return optuna.storages.RDBStorage(target)
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(target))


def study_attrs(study: Any) -> dict[str, Any]:
    """The user attributes of a study's Optuna copy: what it tunes, where, with what.
    ``study``: a ``storage.StudyRecord`` or ``storage.StudySummary``."""
    gpu = getattr(study, "device_name", None) or study.device.name
    problem = Problem(tuple(study.shape), study.dtype, tuple(sorted(study.flags.items())))
    return {COPY_MARK: study.id, "family": study.family, "problem": problem.key,
            "shape": list(study.shape), "dtype": study.dtype, "flags": dict(study.flags),
            "gpu": gpu, "template_version": study.template_hash, "sampler": study.sampler,
            "replay": bool(study.replay)}


def describe(study: optuna.Study, attrs: Mapping[str, Any]) -> None:
    """Name the objective (:data:`METRIC`) and set the study's user attributes."""
    with warnings.catch_warnings():  # experimental since Optuna 3.2, and what the dashboard reads
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([METRIC])
    for key, value in attrs.items():
        study.set_user_attr(key, value)


def space_distributions(space: Mapping[str, Sequence[Any]]) -> dict[str, CategoricalDistribution]:
    """A study's stored space (name -> choices) as Optuna distributions."""
    return {name: CategoricalDistribution(list(dict.fromkeys(_optuna_value(c) for c in choices)))
            for name, choices in space.items()}


def optuna_trial(trial: Any, distributions: Mapping[str, CategoricalDistribution]) -> FrozenTrial:
    """One ``storage.TrialRecord`` as an Optuna trial (COMPLETE or FAIL), dated when it was
    stored. Raises ValueError where a parameter is not of ``distributions``."""
    params = {name: _optuna_value(value) for name, value in trial.params.items()}
    for name, value in params.items():
        if name not in distributions or value not in distributions[name].choices:
            raise ValueError(f"trial {trial.number}: {name}={value!r} is not in the study's space")
    attrs = {"number": trial.number, **{a: getattr(trial, a) for a in _USER_ATTRS
                                        if getattr(trial, a) is not None}}
    ok = trial.status == "ok" and trial.median_ms is not None
    when = trial.created_at.astimezone().replace(tzinfo=None)  # Optuna's dates: local, naive
    return FrozenTrial(
        number=0, trial_id=0, state=TrialState.COMPLETE if ok else TrialState.FAIL,
        value=_ranked(trial) if ok else None, values=None, datetime_start=when,
        datetime_complete=when, params=params,
        distributions={name: distributions[name] for name in params}, user_attrs=attrs,
        system_attrs={}, intermediate_values={})


def optuna_trials(trials: Sequence[Any]) -> list[FrozenTrial]:
    """``storage.TrialRecord``s as Optuna trials, in the order given, each parameter categorical
    over the values the trials hold."""
    choices: dict[str, list[Any]] = {}
    for trial in trials:
        for name, value in trial.params.items():
            choices.setdefault(name, []).append(value)
    distributions = space_distributions(choices)
    return [optuna_trial(trial, distributions) for trial in trials]


def copy_study(name: str, trials: Sequence[Any], target: str, attrs: Mapping[str, Any] | None = None) -> None:
    """Create the study ``name`` (minimize) at ``target``, describe it (``attrs``: its user
    attributes) and add ``trials`` to it.

    Raises ``optuna.exceptions.DuplicatedStudyError`` when ``target`` has that study already."""
    study = optuna.create_study(study_name=name, storage=optuna_storage(target),
                                direction="minimize")
    describe(study, attrs or {})
    study.add_trials(optuna_trials(trials))


def _ranked(trial: Any) -> float:
    """The trial's value as the sampler had it: its median, normalized to the reference GPU where
    several GPUs measured the study (the raw median is a user attribute)."""
    return ranked_ms(getattr(trial, "normalized_ms", None), trial.median_ms)


def _optuna_value(value: Any) -> Any:
    """A parameter value as Optuna holds it: itself, else the ``repr`` of its JSON form (so a
    tuple choice and the list it is read back as are one value)."""
    if type(value) in _OPTUNA_TYPES:
        return value
    try:
        return repr(json.loads(json.dumps(value)))
    except (TypeError, ValueError):
        return repr(value)
