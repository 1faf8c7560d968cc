"""Every config of a family's whole product checked against one problem, once per test session.

Attention's product holds 7.3 million configs and gemm's 6.5 million; gemm's took 17 s a problem
on the 2-core machine (2026-11-29, both cores). The tests that need the
whole product (each rejection has a known reason, the valid configs are those the family
enumerates, the space's summary adds up) share one pass a problem: ``summarize_space`` over the
family, with each config ``check`` accepts kept on the way, in the product's order. The pass is
dealt out among the cores (``tests/cores.py``), whose summaries add up to the whole's.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from typing import Any, NamedTuple

from templates import get_family
from templates.family import H100_LIMITS, Problem, SpaceSummary, summarize_space

import cores


class WholeProduct(NamedTuple):
    summary: SpaceSummary  # what summarize_space counted
    valid: list[dict[str, Any]]  # every config check accepted, as KernelFamily.valid_configs lists them


class _Keeping:
    """The family as summarize_space sees it (``configs`` and ``check``), limited to every
    ``step``-th config of its product from ``first`` (``KernelFamily.configs``' order: no family
    changes it), and keeping each config ``check`` accepts with its place in the product."""

    def __init__(self, family: Any, first: int, step: int) -> None:
        self.family, self.first, self.step = family, first, step
        self.valid: list[tuple[int, dict[str, Any]]] = []
        self._at = first

    def configs(self):
        params = self.family.params
        names = [p.name for p in params]
        values = itertools.islice(itertools.product(*(p.choices for p in params)), self.first, None, self.step)
        for at, v in enumerate(values):
            self._at = self.first + at * self.step
            yield dict(zip(names, v))

    def check(self, config, problem, device):
        reason = self.family.check(config, problem, device)
        if reason is None:
            self.valid.append((self._at, config))
        return reason


def _part(family_name: str, problem: Problem, first: int, step: int) -> tuple[SpaceSummary, list]:
    """Every ``step``-th config of the product from ``first``, checked against ``problem`` on an
    H100: the summary, and the valid configs with their places."""
    keeping = _Keeping(get_family(family_name), first, step)
    summary = summarize_space(keeping, problem, H100_LIMITS)
    return summary, keeping.valid


def _sum(parts: list[tuple[SpaceSummary, list]]) -> WholeProduct:
    """The whole product's summary and valid configs (in the product's order), from its parts."""
    reasons: dict[str, int] = {}
    for summary, _ in parts:
        for reason, n in summary.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    total = SpaceSummary(sum(s.total for s, _ in parts), sum(s.valid for s, _ in parts), reasons)
    return WholeProduct(total, [config for _, config in heapq.merge(*(valid for _, valid in parts),
                                                                     key=lambda placed: placed[0])])


@functools.lru_cache(maxsize=None)
def whole_product(family_name: str, problem: Problem) -> WholeProduct:
    """Every config of ``family_name``'s product checked against ``problem`` on an H100, the
    product dealt out among the cores config by config (a part of the product's neighbours would
    take some parts' expensive regions whole)."""
    step = cores.count()
    futures = [cores.pool().submit(_part, family_name, problem, first, step) for first in range(step)]
    return _sum([future.result() for future in futures])
