"""Warm start: a new study first tries the winners of the nearest problems already tuned.

    picks = nearest_winners(family, problem, repo.bests(family.name, dtype="fp16", device_name=gpu,
                                                        template_hash=h), limit=3)
    for pick in picks:
        study.enqueue_trial(space.encode(pick.params))

"Nearest" is the family's ``distance`` between problems (same GPU and template version): by
default the same element type, flags and last dimension (the head dimension for attention),
ranked by distance in log2 of the second to last dimension (the sequence length) and of the
product of the leading ones (B*H): the tiles that suit S = 4096 usually suit S = 8192, less
often S = 512.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from templates.family import DeviceLimits, KernelFamily, Problem

DEFAULT_PICKS = 3


@dataclass(frozen=True)
class WarmStart:
    """One config a study started from, and how it did there."""

    source: str  # the problem key it won on
    params: dict[str, Any]
    distance: float
    median_ms: float | None = None  # measured in the new study (None: failed or not measured)
    ratio_to_best: float | None = None  # its time over the new study's best

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def nearest_winners(
    family: KernelFamily, problem: Problem, bests: Sequence[Any], limit: int = DEFAULT_PICKS,
    limits: DeviceLimits | None = None,
) -> list[WarmStart]:
    """Up to ``limit`` distinct winners of other problems at a finite ``family.distance``,
    nearest first, that ``family.check`` accepts for ``problem`` (when ``limits`` is given)."""
    candidates = []
    for best in bests:
        other = Problem(tuple(best.shape), best.dtype, tuple(sorted(best.flags.items())))
        away = family.distance(other, problem)
        if other == problem or not math.isfinite(away):
            continue
        candidates.append(WarmStart(other.key, dict(best.params), away))
    picks: list[WarmStart] = []
    for pick in sorted(candidates, key=lambda c: (c.distance, c.source)):
        if any(p.params == pick.params for p in picks):
            continue
        if limits is not None and family.check(pick.params, problem, limits) is not None:
            continue
        picks.append(pick)
        if len(picks) == limit:
            break
    return picks


FAMILY_SOURCE = "family"


def family_points(family: KernelFamily, problem: Problem, limits: DeviceLimits | None,
                  picks: Sequence[WarmStart] = ()) -> list[WarmStart]:
    """The family's own starting points for ``problem`` that ``picks`` does not already hold."""
    if limits is None:
        return []
    taken = [p.params for p in picks]
    return [WarmStart(FAMILY_SOURCE, point, 0.0) for point in family.starting_points(problem, limits)
            if point not in taken]


def outcomes(picks: Sequence[WarmStart], measured: dict[str, Any], best_ms: float | None) -> list[WarmStart]:
    """Each pick with what it measured in the new study (``measured``: params key -> trial)."""
    from storage import params_key

    done = []
    for pick in picks:
        trial = measured.get(params_key(pick.params))
        median = trial.median_ms if trial is not None and trial.status == "ok" else None
        ratio = median / best_ms if median is not None and best_ms else None
        done.append(WarmStart(pick.source, pick.params, pick.distance, median, ratio))
    return done
