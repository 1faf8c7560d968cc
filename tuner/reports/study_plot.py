"""One stored study as one PNG: how the search went, what mattered, what failed.

    tuner.plot_study("attention/2x8x1024x64-fp16-causal/H200/97ec88570060ea5f/replay", "report.png")
    # tuner report STUDY -o report.png

Four panels under a title naming the family, problem, GPU and template version: the best median
so far against the trial number and against the study's wall time (from its first trial to
each trial's storing; a study resumed later shows the gap), with each ok trial's median as a dot;
Optuna's parameter importances (``optuna.importance.get_param_importances`` with its PED-ANOVA
evaluator, the one optuna-dashboard shows, over the ok trials; fANOVA would need scikit-learn);
and the failed trials by kind. A panel without data (no ok trials, too few for importances, no
failures) says so in words. Needs matplotlib (``pip install 'kernel-tuner-service[plot]'``).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import optuna

from tuner.errors import UsageError, first_line
from tuner.study.optuna_export import optuna_trial, space_distributions

MIN_IMPORTANCE_TRIALS = 10  # ok trials below which importances are not computed
TOP_PARAMS = 12  # parameters shown in the importance panel


def plot_study(name: str, out: str | Path, db: str | None = None) -> Path:
    """Write the report of the stored study ``name`` (or its id) to ``out`` as PNG; returns the
    path. One-line errors: no such study (:class:`tuner.NotFound`), an output that cannot be
    written or no matplotlib (:class:`tuner.UsageError`)."""
    from tuner.api import show

    detail = show(name, db=db)
    plt = _pyplot()
    fig = figure(plt, detail.summary, detail.trials)
    try:
        fig.savefig(out, format="png", dpi=110)
    except OSError as error:
        raise UsageError(f"cannot write {out}: {error.strerror or first_line(error)}") from None
    finally:
        plt.close(fig)
    return Path(out)


def figure(plt: Any, summary: Any, trials: Sequence[Any]) -> Any:
    """The report of a study (``storage.StudySummary``) and its trials (``storage.TrialRecord``),
    as a matplotlib figure."""
    from tuner.study.optuna_export import study_attrs

    attrs = study_attrs(summary)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    replay = ", replayed" if summary.replay else ""
    fig.suptitle(f"{attrs['family']} {attrs['problem']} on {attrs['gpu']}, template {attrs['template_version']}"
                 f"{replay}\n{summary.n_trials} trials ({summary.n_ok} ok, {summary.n_failed} failed), "
                 f"{summary.sampler} sampler, study {summary.status}", fontsize=11)
    ok = [t for t in trials if t.status == "ok" and t.median_ms is not None and math.isfinite(t.median_ms)]
    _best_so_far(axes[0][0], trials, [t.number for t in trials], "trial number")
    start = min((t.created_at for t in trials), default=None)
    seconds = [(t.created_at - start).total_seconds() for t in trials] if start else []
    unit, scale = ("min", 60.0) if max(seconds, default=0.0) > 120 else ("s", 1.0)
    _best_so_far(axes[0][1], trials, [s / scale for s in seconds], f"wall time since the first trial ({unit})")
    _importances(axes[1][0], ok)
    _failures(axes[1][1], trials)
    fig.tight_layout()
    return fig


def _best_so_far(ax: Any, trials: Sequence[Any], x: Sequence[float], label: str) -> None:
    ax.set_xlabel(label)
    ax.set_ylabel("median (ms)")
    points = sorted(((xi, t) for xi, t in zip(x, trials)), key=lambda p: (p[0], p[1].number))
    ok = [(xi, t.median_ms) for xi, t in points if t.status == "ok" and t.median_ms is not None]
    if not ok:
        _say(ax, "no ok trials")
        return
    ax.scatter([p[0] for p in ok], [p[1] for p in ok], s=10, color="tab:blue", alpha=0.35,
               label="each ok trial")
    best, steps = math.inf, []
    for xi, value in ok:
        best = min(best, value)
        steps.append((xi, best))
    ax.step([s[0] for s in steps], [s[1] for s in steps], where="post", color="tab:red",
            label=f"best so far ({best:.4f} ms)")
    failed = [xi for xi, t in points if t.status != "ok"]
    if failed:  # along the bottom edge, whatever the scale
        ax.plot(failed, [0.03] * len(failed), "x", color="black", markersize=6, linestyle="none",
                transform=ax.get_xaxis_transform(), label=f"failed ({len(failed)})")
    middle = sorted(v for _, v in ok)[len(ok) // 2]
    ax.set_ylim(best * 0.96, max(middle, steps[0][1], best * 1.05) * 1.03)  # the slower half clipped
    ax.legend(loc="upper right", fontsize=8)


def _importances(ax: Any, ok: Sequence[Any]) -> None:
    ax.set_title("parameter importances (Optuna, PED-ANOVA, ok trials)", fontsize=10)
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        _say(ax, f"too few ok trials for importances ({len(ok)}, {MIN_IMPORTANCE_TRIALS} needed)")
        return
    importances = param_importances(ok)
    if isinstance(importances, str):
        _say(ax, importances)
        return
    nonzero = [(name, value) for name, value in importances.items() if value > 0]
    shown = nonzero[:TOP_PARAMS][::-1]
    if not shown:
        _say(ax, "no parameter shows an effect")
        return
    ax.barh([name for name, _ in shown], [value for _, value in shown], color="tab:green")
    left = len(importances) - len(shown)
    ax.set_xlabel("importance" + (f" ({left} more parameters below, or without effect, not shown)" if left else ""))
    ax.tick_params(axis="y", labelsize=8)


def param_importances(ok: Sequence[Any]) -> dict[str, float] | str:
    """Optuna's importances (PED-ANOVA) of the parameters over the ok trials
    (``storage.TrialRecord``), most important first; a one-line reason (str) where Optuna
    cannot compute them."""
    choices: dict[str, list[Any]] = {}
    for trial in ok:
        for name, value in trial.params.items():
            choices.setdefault(name, []).append(value)
    distributions = space_distributions(choices)
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory"
    try:
        study = optuna.create_study(direction="minimize")
        study.add_trials([optuna_trial(t, distributions) for t in ok])
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ZeroDivisionError) as error:
        return f"importances not computed: {first_line(error)}"
    finally:
        optuna.logging.set_verbosity(level)
    return found if found else "no parameter varies among the ok trials"


def _failures(ax: Any, trials: Sequence[Any]) -> None:
    ax.set_title("failed trials by kind", fontsize=10)
    kinds = Counter(t.failure or "unknown" for t in trials if t.status != "ok")
    if not kinds:
        _say(ax, "no failed trials")
        return
    names = sorted(kinds, key=lambda k: (-kinds[k], k))
    bars = ax.bar(names, [kinds[k] for k in names], color="tab:orange", width=0.6)
    ax.bar_label(bars)
    ax.set_xlim(-0.8, max(len(names), 3) - 0.2)
    ax.set_ylim(0, max(kinds.values()) * 1.15)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("trials")


def _say(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11, color="dimgrey")
    ax.set_xticks([])
    ax.set_yticks([])


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("the report needs matplotlib: pip install 'kernel-tuner-service[plot]'") from None
    return plt
