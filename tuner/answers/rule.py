"""A config for a problem never tuned, picked from the tuned ones, and how good that pick is.

    pick = pick_config(family, problem, repo.bests(family.name), limits_of)
    print(pick.params, "from", pick.source)                  # not measured for this shape
    score = leave_one_out(family, repo.bests(family.name), limits_of, trials_of)
    print(score.median, score.worst, score.unknown)

The rule is the nearest neighbour: the winner of the tuned problem nearest by the family's
``distance`` (same dtype and flags first), provided the family's constraints accept it for the
new problem; else the next nearest; else the family's first starting point. Ranking, nearest
first: problems at a finite ``distance``; then those of the same dtype and flags (a ``distance``
of inf, another head dimension say), nearest in the shape; then the rest, nearest in the shape.
Winners of the current template version come before older ones at the same rank.

The rule is measured leave-one-out, over the tuned problems of each GPU and template version:
each one's pick from the others, timed on it when the pick was one of its study's trials
(unknown otherwise), over its own best.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from templates.family import DeviceLimits, KernelFamily, Problem

FAMILY_SOURCE = "the family's starting point"
RULE = "nearest tuned problem (the family's distance), valid under its constraints"

LimitsOf = Callable[[Any], DeviceLimits]  # a stored best -> the limits of the GPU it ran on


@dataclass(frozen=True)
class Pick:
    """The config the rule picks for ``problem``, unmeasured there."""

    params: dict[str, Any]
    source: str  # the key of the problem it won on, or FAMILY_SOURCE
    distance: float | None  # the family's distance from that problem (None: a starting point)
    winner: Any = None  # the source's storage.BestRecord (None: a starting point)
    passed_over: tuple[str, ...] = ()  # nearer winners the constraints refused here: "key: reason"


def problem_of(best: Any) -> Problem:
    """The problem a stored best (``storage.BestRecord``) was tuned for."""
    return Problem(tuple(best.shape), best.dtype, tuple(sorted(best.flags.items())))


def shape_distance(family: KernelFamily, a: Problem, b: Problem) -> float:
    """How far apart two shapes are when dtype and flags are set aside: the family's distance
    with ``a`` given ``b``'s dtype and flags, else the sum of the dims' log2 ratios."""
    alike = family.distance(Problem(a.shape, b.dtype, b.flags), b)
    if math.isfinite(alike):
        return alike
    if len(a.shape) != len(b.shape) or not all(x > 0 and y > 0 for x, y in zip(a.shape, b.shape)):
        return math.inf
    return sum(abs(math.log2(x / y)) for x, y in zip(a.shape, b.shape))


def ranked(family: KernelFamily, problem: Problem, bests: Sequence[Any]) -> list[tuple[Any, float]]:
    """The stored bests of other problems, nearest first by the rule's order, with the family's
    distance of each."""
    order = []
    template_hash = family.template_hash  # read once: it hashes the family's files
    for best in bests:
        other = problem_of(best)
        if other == problem:
            continue
        away = family.distance(other, problem)
        if math.isfinite(away):
            rank = (0, away)
        else:
            same = other.dtype == problem.dtype and other.flags == problem.flags
            rank = (1 if same else 2, shape_distance(family, other, problem))
        current = best.template_hash == template_hash
        order.append(((*rank, not current, other.key, best.median_ms), best, away))
    return [(best, away) for _, best, away in sorted(order, key=lambda item: item[0])]


def pick_config(family: KernelFamily, problem: Problem, bests: Sequence[Any],
                limits_of: LimitsOf, default_limits: DeviceLimits) -> Pick | None:
    """The rule's config for ``problem`` from ``bests`` (stored bests of the family, the
    problem's own left out), or None when no winner and no starting point is valid for it.
    ``limits_of`` gives the GPU limits a winner is checked under (those of the GPU it won on);
    the starting points are checked under ``default_limits``."""
    passed: list[str] = []  # once each (a problem may be tuned on several GPUs and versions)
    for best, away in ranked(family, problem, bests):
        source = problem_of(best).key
        params = family.complete(best.params)
        try:
            family.validate_params(params)  # a winner of an older space may have left it
            reason = family.check(params, problem, limits_of(best))
        except ValueError as error:
            reason = str(error)
        if reason is None:
            return Pick(params, source, away if math.isfinite(away) else None, best, tuple(passed))
        if f"{source}: {reason}" not in passed:
            passed.append(f"{source}: {reason}")
    for point in family.starting_points(problem, default_limits):
        if family.check(point, problem, default_limits) is None:
            return Pick(dict(point), FAMILY_SOURCE, None, None, tuple(passed))
    return None


@dataclass(frozen=True)
class Held:
    """One tuned problem left out: what the rule picked for it from the others, and how that did."""

    problem: str  # its key
    device: str
    template_hash: str
    source: str  # where the pick came from (a problem key or FAMILY_SOURCE)
    outcome: str  # "measured" | "failed" (the pick failed there) | "unknown" (never measured there)
    ratio: float | None  # the pick's time there over its best (measured only)


@dataclass(frozen=True)
class RuleScore:
    """The rule measured leave-one-out."""

    rule: str
    held: tuple[Held, ...] = ()
    median: float | None = None  # of the known ratios
    worst: float | None = None
    known: int = 0
    unknown: int = 0
    failed: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)


def leave_one_out(family: KernelFamily, bests: Sequence[Any], limits_of: LimitsOf,
                  trials_of: Callable[[str], Mapping[str, Any]]) -> RuleScore:
    """For each stored best, the rule's pick from the other problems of its GPU and template
    version, and that pick's time on it over its best. ``trials_of(study)`` gives a study's
    trials by ``storage.params_key``; a pick it does not hold is unknown, one that failed there
    is counted apart. Times are the search's medians on both sides (the best's
    ``search_median_ms``), from one study."""
    from storage import params_key

    groups: dict[tuple[str, str], list[Any]] = {}
    for best in bests:
        groups.setdefault((best.device.name, best.template_hash), []).append(best)
    held = []
    for (device, version), group in sorted(groups.items()):
        for best in group:
            problem = problem_of(best)
            others = [b for b in group if problem_of(b) != problem]
            pick = pick_config(family, problem, others, limits_of, limits_of(best))
            if pick is None:
                held.append(Held(problem.key, device, version, "-", "unknown", None))
                continue
            if params_key(pick.params) == params_key(family.complete(best.params)):
                held.append(Held(problem.key, device, version, pick.source, "measured", 1.0))
                continue
            trial = trials_of(best.study).get(params_key(pick.params))
            if trial is None:
                held.append(Held(problem.key, device, version, pick.source, "unknown", None))
            elif trial.status != "ok" or trial.median_ms is None:
                held.append(Held(problem.key, device, version, pick.source, "failed", None))
            else:
                held.append(Held(problem.key, device, version, pick.source, "measured",
                                 trial.median_ms / best.search_median_ms))
    ratios = [h.ratio for h in held if h.ratio is not None]
    return RuleScore(
        RULE, tuple(held),
        median=statistics.median(ratios) if ratios else None,
        worst=max(ratios) if ratios else None,
        known=len(ratios),
        unknown=sum(h.outcome == "unknown" for h in held),
        failed=sum(h.outcome == "failed" for h in held),
    )


def score_line(score: RuleScore) -> str:
    """``tuner coverage``'s line on the rule."""
    if not score.held:
        return "rule: no tuned problems to measure it on"
    text = f"rule ({score.rule}), leave-one-out over {len(score.held)} tuned problem(s): "
    if score.known:
        text += f"median {score.median:.2f}x, worst {score.worst:.2f}x its best ({score.known} known"
    else:
        text += "no ratio known (0 known"
    text += (f"; {score.unknown} unknown: the pick was never measured there"
             f"; {score.failed} failed there)")
    return text
