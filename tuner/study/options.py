"""A study's settings as frozen values, built once where a call comes in and passed whole::

    options = StudyOptions(trials=200, sampler="random", seed=1)
    tuner.tune("attention", "4,16,4096,128", "fp16", {"causal": True}, options=options)

:class:`StudyOptions` is what a user chooses about a search (``tuner.tune``'s keywords);
:class:`LoopOptions` how the coordinator's loop runs and what it reports to (tests and tools
set it); ``workers.pool_options.PoolOptions`` where the trials are measured.
:func:`split_keywords` maps ``tune``'s keywords onto the first and the last.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from tuner.study.final_best import DEFAULT_TOP
from tuner.study.warmstart import DEFAULT_PICKS
from workers.pool_options import PoolOptions

logger = logging.getLogger("tuner")

MAX_IDLE_ASKS = 500
# tune()'s keywords that say where trials are measured (PoolOptions), not how the study searches
POOL_KEYWORDS = ("ray_address", "replay", "simulate_gpus", "measure_timeout_s")


@dataclass(frozen=True)
class StudyOptions:
    """How a study searches and when it stops (see :func:`tuner.tune` for each).

    ``only``: measure that one config and nothing else (no warm start). ``skip_at_budget``: a
    study already at its budget is not run again (``status="skipped"``). ``replay``: the
    landscape the study is answered from (None: GPUs); its name and settings say so."""

    trials: int | None = None
    time_budget: float | None = None
    sampler: str = "tpe"
    seed: int | None = None
    warm_start: int = DEFAULT_PICKS
    retime: int = DEFAULT_TOP
    early_stop: bool = True
    constant_liar: bool = True
    only: Mapping[str, Any] | None = None
    skip_at_budget: bool = False
    replay: str | Path | None = None


@dataclass(frozen=True)
class LoopOptions:
    """How the coordinator's loop runs: trials in flight at once (``lookahead``, None: enough
    for every GPU and compile worker), asks in a row without a new config before it stops,
    seconds a poll waits, and what it reads the time from and reports to (``meter``: a
    :class:`tuner.study.meter.Meter`; ``stored``: called with each trial stored). ``stop_when``:
    asked before each new trial, a reason to ask no more (the trials in flight finish and are
    stored), or None to go on."""

    lookahead: int | None = None
    max_idle_asks: int = MAX_IDLE_ASKS
    poll_interval: float = 0.5
    clock: Callable[[], float] | None = None  # None: time.monotonic
    progress: Any = None  # tuner.study.progress.Progress (None: one of the study's)
    meter: Any = None
    stored: Callable[[Any], None] | None = None
    stop_when: Callable[[], str | None] | None = None
    copies: Any = None  # tuner.study.shared_run.SharedRun: starts the optuna-dashboard copy, takes it at the end


DEFAULT_LOOP = LoopOptions()


def split_keywords(call: str, keywords: Mapping[str, Any], options: StudyOptions | None,
                   pool: PoolOptions | None) -> tuple[StudyOptions, PoolOptions]:
    """``call``'s keywords (``tune(trials=..., replay=...)``) onto its options: the study's
    fields to a StudyOptions, where trials are measured to a PoolOptions; one TypeError for a
    keyword that names neither."""
    keywords = dict(keywords)
    if keywords.pop("batch", None) is not None:
        logger.warning("%s(batch=...) no longer has an effect: trials are always asked, leased and "
                       "stored in batches", call)
    study_fields = {f.name for f in fields(StudyOptions)} - {"replay"}
    unknown = sorted(set(keywords) - study_fields - set(POOL_KEYWORDS))
    if unknown:
        raise TypeError(f"{call}() got unexpected keyword argument(s): {', '.join(unknown)}")
    study = replace(options or StudyOptions(), **{k: v for k, v in keywords.items() if k in study_fields})
    where = replace(pool or PoolOptions(), **{k: v for k, v in keywords.items() if k in POOL_KEYWORDS})
    return replace(study, replay=where.replay), where
