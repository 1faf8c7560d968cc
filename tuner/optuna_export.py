"""A stored study copied into an Optuna storage, for optuna-dashboard and Optuna's own tools.

Our tables are the record of a study; Optuna holds it only in memory while it runs. To look at
a study with Optuna's tools, copy it out on demand::

    tuner.export_optuna(name, "study.log")              # a journal file
    tuner.export_optuna(name, "sqlite:///optuna.db")    # or any Optuna RDB URL
    # then: optuna-dashboard study.log   (or: optuna-dashboard sqlite:///optuna.db)

Each stored trial becomes one Optuna trial: an ok one COMPLETE with its median (ms), a failed
one FAIL; the stored number, TFLOPS, failure and GPU state travel as user attributes. Every
parameter is categorical over the values the study stored (values Optuna cannot hold, such as
lists, as their ``repr``). Only Optuna's public API is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

_OPTUNA_TYPES = (type(None), bool, int, float, str)
_USER_ATTRS = ("tflops", "failure", "reason", "registers", "spill_stores", "cubin_hash", "toolkit",
               "iqr_ms", "repetitions", "replayed", "gpu_state", "median_ms", "gpu_uuid",
               "gpu_index", "gpu_ratio")


def optuna_storage(target: str) -> optuna.storages.BaseStorage:
    """``target`` as an Optuna storage: a URL (``sqlite:///...``, ``postgresql://...``) as an
    RDB storage, anything else as the path of a journal file."""
    if "://" in target:
        return optuna.storages.RDBStorage(target)
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(target))


def optuna_trials(trials: Sequence[Any]) -> list[FrozenTrial]:
    """``storage.TrialRecord``s as Optuna trials, in the order given."""
    names = sorted({name for trial in trials for name in trial.params})
    choices: dict[str, list[Any]] = {name: [] for name in names}
    for trial in trials:
        for name, value in trial.params.items():
            value = _optuna_value(value)
            if value not in choices[name]:
                choices[name].append(value)
    distributions = {name: CategoricalDistribution(values) for name, values in choices.items()}
    copied = []
    for trial in trials:
        params = {name: _optuna_value(value) for name, value in trial.params.items()}
        attrs = {"number": trial.number, **{a: getattr(trial, a) for a in _USER_ATTRS
                                            if getattr(trial, a) is not None}}
        ok = trial.status == "ok"
        copied.append(optuna.trial.create_trial(
            state=TrialState.COMPLETE if ok else TrialState.FAIL,
            value=_ranked(trial) if ok else None, params=params,
            distributions={name: distributions[name] for name in params}, user_attrs=attrs))
    return copied


def copy_study(name: str, trials: Sequence[Any], target: str) -> None:
    """Create the study ``name`` (minimize) at ``target`` and add ``trials`` to it.

    Raises ``optuna.exceptions.DuplicatedStudyError`` when ``target`` has that study already."""
    study = optuna.create_study(study_name=name, storage=optuna_storage(target),
                                direction="minimize")
    study.add_trials(optuna_trials(trials))


def _ranked(trial: Any) -> float:
    """The trial's value as the sampler had it: its median, normalized to the reference GPU where
    several GPUs measured the study (the raw median is a user attribute)."""
    normalized = getattr(trial, "normalized_ms", None)
    return normalized if normalized is not None else trial.median_ms


def _optuna_value(value: Any) -> Any:
    return value if type(value) in _OPTUNA_TYPES else repr(value)
