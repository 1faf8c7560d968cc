"""How fast each sampler finds a near-best config, on landscapes recorded on a GPU.

    report = bench_search(["templates/attention/landscapes/attention_2x8x1024x64-fp16-causal_h200.json"], seeds=20)
    report.samplers["tpe"].median_2pct     # measured trials to come within 2% of the best

A replay runner in the manner of Kernel Tuner's: each run is an Optuna study in memory that asks,
checks, and is told the recorded median (``inf`` for a failed config) with the rules of a real
study: configs the family rejects or the landscape lacks are told ``inf`` without counting, a config
already measured fails without counting (the sampler's data holds each config once). A run stops
once it is within 2% of the landscape's best, or when every valid config has been measured.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import optuna

from templates.family import DeviceLimits
from storage import tied
from tuner.study import search, warmstart

logger = logging.getLogger("tuner")

# Each as a study runs it: tpe, the default (tuner.study.batchtpe's batches); optuna-tpe, Optuna's TPE
# asked one config at a time (constant liar); random and grid, Optuna's. tpe-start: tpe after the
# family's starting points, as a new study with nothing tuned near it runs; tpe-warm: after the
# winners of the nearest other landscapes.
SAMPLERS = ("tpe", "optuna-tpe", "random", "grid", "tpe-start", "tpe-warm")
RENAMED = {"tpe-batch": "tpe", "tpe-flight": "optuna-tpe"}  # the names these had before
# trials in flight: a study on one GPU keeps its compile workers and the GPU's queue busy (16 and
# more on a GPU machine); 1 runs each sampler one trial at a time
IN_FLIGHT = 16
DEFAULT_SAMPLERS = SAMPLERS
NOT_APPLICABLE = {
    "cmaes": "Optuna's CMA-ES samples no categorical parameters (every parameter here is one)",
    "gp": "Optuna's GP sampler needs PyTorch, which the service does not install",
}
MAX_ASKS_PER_CONFIG = 50


@dataclass(frozen=True)
class _Landscape:
    name: str
    family: Any
    problem: Any
    values: dict[str, float]  # params key -> recorded median (inf when it failed)
    valid: int  # configs the family accepts that the landscape recorded
    best: float
    winner: dict[str, Any]
    limits: DeviceLimits
    space: search.SearchSpace  # the part of the family's space the landscape recorded
    points: list[dict[str, Any]]  # the family's valid configs in that space (the samplers' choices)
    intervals: dict[str, float] = field(default_factory=dict)  # params key -> its value's half-width


@dataclass
class SamplerResult:
    name: str
    trials_2pct: list[int] = field(default_factory=list)  # one per (landscape, seed) run
    trials_5pct: list[int] = field(default_factory=list)
    trials_tie: list[int] = field(default_factory=list)  # to a config tied with the best
    curves: list[list[float]] = field(default_factory=list)  # best-so-far / landscape best
    by_landscape: dict[str, list[int]] = field(default_factory=dict)  # name -> trials to 2%, per seed

    def stats(self) -> dict[str, float]:
        return {
            "median_trials_2pct": statistics.median(self.trials_2pct),
            "p90_trials_2pct": _quantile(self.trials_2pct, 0.9),
            "median_trials_5pct": statistics.median(self.trials_5pct),
            "p90_trials_5pct": _quantile(self.trials_5pct, 0.9),
            "median_trials_tie": statistics.median(self.trials_tie),
            "p90_trials_tie": _quantile(self.trials_tie, 0.9),
            "runs": len(self.trials_2pct),
            "median_trials_2pct_by_landscape": {
                name: statistics.median(runs) for name, runs in self.by_landscape.items()},
        }


@dataclass(frozen=True)
class SearchReport:
    samplers: dict[str, SamplerResult]
    space_size: int  # valid recorded configs (median over the landscapes)
    landscapes: tuple[str, ...]
    seeds: int
    not_applicable: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"samplers": {n: r.stats() for n, r in self.samplers.items()},
                "space_size": self.space_size, "landscapes": list(self.landscapes),
                "seeds": self.seeds, "not_applicable": self.not_applicable}


def _quantile(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)])


def load(path: str | Path, family: Any = None) -> _Landscape:
    """A landscape file and its family: the one it names (an installed or registered family), or
    ``family`` (a reference ``get_family`` takes: a path, ``module:ATTR``) for one found elsewhere,
    which must be the family the landscape recorded."""
    from storage import interval_ms, params_key
    from templates import get_family
    from templates.family import TemplateError
    from tuner.errors import UsageError
    from workers.errors import WorkerError
    from workers.replay import load_landscape

    try:
        recorded = load_landscape(path)
        family = get_family(recorded.family if family is None else family)
    except (WorkerError, TemplateError) as error:
        raise UsageError(str(error)) from None
    if family.name != recorded.family:
        raise UsageError(f"{Path(path).name} was recorded for family {recorded.family!r}, not {family.name!r}")
    info = recorded.device
    limits = info.limits
    values = {params_key(p): (m.timing.median_ms if m.ok else math.inf) for p, m in recorded.entries
              if family.check(p, recorded.problem, limits) is None}
    intervals = {params_key(p): interval_ms(m.timing.median_ms, m.timing.iqr_ms, m.timing.repetitions) or 0.0
                 for p, m in recorded.entries if m.ok and params_key(p) in values}
    best_key = min(values, key=values.get)
    winner = next(dict(p) for p, _ in recorded.entries if params_key(p) == best_key)
    space = search.SearchSpace(family.recorded_space([p for p, _ in recorded.entries]))
    points = search.valid_in_space(family, recorded.problem, limits, space)
    return _Landscape(Path(path).name, family, recorded.problem, values, len(values),
                      values[best_key], winner, limits, space, points, intervals)


class RunResult(NamedTuple):
    """One run: measured trials to come within 5% and 2% of the landscape's best, the best-so-far
    curve (over the best), and the trials to measure a config tied with the best (within their
    intervals, ``storage.ranking``: where the recording cannot tell them apart)."""

    five: int
    two: int
    curve: list[float]
    tie: int


class _Progress:
    """A search's best-so-far curve over a landscape, and the measured trials it took to come
    within 5% and 2% of the landscape's best, and to a tie with it."""

    def __init__(self, land: "_Landscape") -> None:
        self.land = land
        self.curve: list[float] = []
        self.hit5: int | None = None
        self.hit2: int | None = None
        self.tie: int | None = None
        best_key = min(land.values, key=land.values.get)
        self._best_interval = land.intervals.get(best_key, 0.0)

    def add(self, seen: Mapping[str, float], key: str = "") -> None:
        """After a trial: ``seen``, every config measured so far and its value; ``key``, the
        trial's config."""
        self.curve.append(min(seen.values()) / self.land.best)
        if self.hit5 is None and self.curve[-1] <= 1.05:
            self.hit5 = len(seen)
        if self.hit2 is None and self.curve[-1] <= 1.02:
            self.hit2 = len(seen)
        value = seen.get(key, math.inf)
        if self.tie is None and math.isfinite(value) and tied(value, self.land.intervals.get(key, 0.0),
                                                              self.land.best, self._best_interval):
            self.tie = len(seen)

    def done(self, seen: Mapping[str, float]) -> bool:
        return (self.hit2 is not None and self.tie is not None) or len(seen) == self.land.valid

    def result(self) -> RunResult:
        valid = self.land.valid
        return RunResult(self.hit5 or valid, self.hit2 or valid, self.curve, self.tie or valid)


def run(land: _Landscape, name: str, seed: int, in_flight: int = IN_FLIGHT,
        first: Sequence[Mapping[str, Any]] = (), *, failed_as_fail: bool = False) -> RunResult:
    """Measured trials for sampler ``name`` to come within 5% and 2% of the landscape's best, and
    the best-so-far curve, with the rules of a real study: configs the family rejects or the
    landscape lacks are told ``inf`` without counting, a config measured or in flight asked again
    fails without counting, ``first`` is measured before anything is proposed. ``in_flight``
    trials are measured at once: the oldest eighth of them (at least one) finish together, then the
    free slots are filled again (``tpe``: one batch; the others: one ask each). Trials count in the
    order they finish. ``failed_as_fail``: a failed config is told FAIL, not ``inf`` (what the
    sampler would see if it read the optuna-dashboard copy, :mod:`tuner.study.dashboard`; not what a
    study does)."""
    from collections import deque

    from storage import params_key
    from tuner.study.batchtpe import BatchProposer

    space = land.space
    valid_check = lambda p: land.family.check(p, land.problem, land.limits) is None  # noqa: E731
    kind = "optuna-tpe" if name == "optuna-tpe" else name if name in ("random", "grid") else "tpe"
    sampler = search.make_sampler(kind, space, seed, land.points, valid=valid_check)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    batcher = None
    if kind == "tpe":
        valid = [c for c in space.configs() if params_key(c) in land.values]
        batcher = BatchProposer(space, valid, seed=seed)
    for params in first:
        study.enqueue_trial(space.encode(params))
    queued = len(first)  # asked with their own params, before any batch
    flying: deque[tuple[Any, str, dict[str, Any]]] = deque()  # (trial or None, key, encoded)
    seen: dict[str, float] = {}
    progress = _Progress(land)
    step = max(1, in_flight // 8)
    for _ in range(MAX_ASKS_PER_CONFIG * land.valid):
        keys = {key for _, key, _ in flying}
        free = min(in_flight - len(flying), land.valid - len(seen) - len(flying))
        if free > 0 and (batcher is None or queued):
            trial = study.ask(space.distributions)
            queued = max(0, queued - 1)
            key = params_key(space.decode(trial.params))
            if key not in land.values:
                study.tell(trial, math.inf)
            elif key in seen or key in keys:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                flying.append((trial, key, trial.params))
            continue
        if free > 0:
            observed = [(t.params, t.value) for t in study.get_trials(deepcopy=False, states=(
                optuna.trial.TrialState.COMPLETE,))]
            for pick in batcher.propose(observed=observed, pending=[e for _, _, e in flying], count=free):
                flying.append((None, params_key(space.decode(pick)), pick))
        for _ in range(min(step, len(flying))):
            trial, key, encoded = flying.popleft()
            value = land.values[key]
            told = optuna.trial.TrialState.FAIL if failed_as_fail and math.isinf(value) else None
            if trial is None:
                study.add_trial(optuna.trial.create_trial(
                    params=encoded, distributions=space.distributions, value=None if told else value,
                    state=told or optuna.trial.TrialState.COMPLETE))
            else:
                study.tell(trial, None if told else value, state=told)
            seen[key] = value
            progress.add(seen, key)
            if progress.done(seen):
                return progress.result()
    return progress.result()


def bench_search(paths: Sequence[str | Path], *, seeds: int = 20, samplers: Sequence[str] = DEFAULT_SAMPLERS,
                 progress: Callable[[str], None] | None = None, family: Any = None,
                 in_flight: int = IN_FLIGHT) -> SearchReport:
    """Run every sampler ``seeds`` times on every landscape; ``tpe-start`` starts each landscape
    from the family's starting points, ``tpe-warm`` from the winners of the nearest others that a
    study would warm-start from (at a finite family distance: for attention the same element type,
    causal flag and head dimension; landscapes with none are skipped, and so is ``tpe-warm`` with a single landscape).
    Every sampler runs with ``in_flight`` trials measured at once (:func:`run`), as a study does
    (1: one trial at a time)."""
    for old in set(samplers) & RENAMED.keys():
        logger.warning("bench-search: sampler %r is now called %r", old, RENAMED[old])
    samplers = [RENAMED.get(name, name) for name in samplers]
    unknown = [s for s in samplers if s not in SAMPLERS]
    if unknown:
        from tuner.errors import UsageError

        raise UsageError(f"unknown sampler {unknown[0]!r} (choose from {', '.join(SAMPLERS)})")
    lands = [load(p, family) for p in paths]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = {name: SamplerResult(name) for name in samplers if name != "tpe-warm" or len(lands) > 1}
    for land in lands:
        others = [_Winner(o) for o in lands if o is not land and o.family.name == land.family.name]
        first = {
            "tpe-warm": [p.params for p in warmstart.nearest_winners(land.family, land.problem, others,
                                                                     limits=land.limits)],
            "tpe-start": land.family.starting_points(land.problem, land.limits),
        }
        space = land.space
        first = {name: [p for p in points if space.contains(p)] for name, points in first.items()}
        for name, result in results.items():
            if name == "tpe-warm" and not first[name]:
                continue
            for seed in range(seeds):
                five, two, curve, tie = run(land, name, seed, in_flight, first.get(name, ()))
                result.trials_tie.append(tie)
                result.trials_5pct.append(five)
                result.trials_2pct.append(two)
                result.curves.append(curve)
                result.by_landscape.setdefault(land.name, []).append(two)
            if progress:
                progress(f"{land.name} {name}: median {statistics.median(result.by_landscape[land.name])} "
                         f"trials to 2%")
    sizes = sorted(land.valid for land in lands)
    results = {name: result for name, result in results.items() if result.trials_2pct}
    return SearchReport(results, sizes[len(sizes) // 2], tuple(l.name for l in lands), seeds,
                        dict(NOT_APPLICABLE))


class _Winner:
    """A landscape's best config in the shape :func:`warmstart.nearest_winners` reads."""

    def __init__(self, land: _Landscape) -> None:
        self.shape, self.params = land.problem.shape, land.winner
        self.dtype, self.flags = land.problem.dtype, dict(land.problem.flags)


def check_plot(path: str | Path) -> None:
    """UsageError where :func:`plot` could not write ``path`` (no matplotlib; a folder that is
    not there, is a file or is not writable): found before the runs rather than after them.
    Nothing is left behind."""
    from tuner.errors import UsageError

    _pyplot()
    target = Path(path)
    existed = target.exists()
    try:
        with open(target, "ab"):  # writes nothing; creates the file where it was not there
            pass
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None
    if not existed:
        target.unlink()


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from tuner.errors import UsageError

        raise UsageError("the plot needs matplotlib: pip install 'kernel-tuner-service[plot]'") from None
    return plt


def plot(report: SearchReport, path: str | Path) -> Path:
    """Median best-so-far (over runs) against measured trials, one line per sampler, as PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in report.samplers.items():
        length = max(len(c) for c in result.curves)
        padded = [c + [c[-1]] * (length - len(c)) for c in result.curves]
        median = [statistics.median(col) for col in zip(*padded)]
        ax.plot(range(1, length + 1), median, label=name)
    ax.axhline(1.02, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("measured trials")
    ax.set_ylabel("best so far / landscape best (median of runs)")
    ax.set_title(f"{len(report.landscapes)} landscape(s), {report.seeds} seeds")
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as error:
        from tuner.errors import UsageError

        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        plt.close(fig)
    return Path(path)
