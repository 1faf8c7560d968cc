"""Every config of a family's whole product checked against one problem, once per test session.

Attention's product holds 7.3 million configs and gemm's 6.5 million; gemm's took 17 s a problem
on the 2-core machine (2026-11-29, both cores). The tests that need the
whole product (each rejection has a known reason, the valid configs are those the family
enumerates, the space's summary adds up) share one pass a problem: ``summarize_space`` over the
family, with each config ``check`` accepts kept on the way, in the product's order. The pass is
split into contiguous parts of the product, one a core (``tests/cores.py``), whose summaries add
up to the whole's.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, NamedTuple

from templates import get_family
from templates.family import H100_LIMITS, Problem, SpaceSummary, summarize_space

import cores


class WholeProduct(NamedTuple):
    summary: SpaceSummary  # what summarize_space counted
    valid: list[dict[str, Any]]  # every config check accepted, as KernelFamily.valid_configs lists them


class _Keeping:
    """The family as summarize_space sees it (``configs`` and ``check``), limited to the configs
    ``start`` to ``stop`` of its product and keeping each config ``check`` accepts."""

    def __init__(self, family: Any, start: int, stop: int) -> None:
        self.family, self.start, self.stop = family, start, stop
        self.valid: list[dict[str, Any]] = []

    def configs(self):
        return itertools.islice(self.family.configs(), self.start, self.stop)

    def check(self, config, problem, device):
        reason = self.family.check(config, problem, device)
        if reason is None:
            self.valid.append(config)
        return reason


def _part(family_name: str, problem: Problem, start: int, stop: int) -> WholeProduct:
    """The configs ``start`` to ``stop`` of the product checked against ``problem`` on an H100."""
    keeping = _Keeping(get_family(family_name), start, stop)
    summary = summarize_space(keeping, problem, H100_LIMITS)
    return WholeProduct(summary, keeping.valid)


def _bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges that cover ``range(size)`` in order."""
    edges = [size * i // parts for i in range(parts + 1)]
    return list(zip(edges, edges[1:]))


def _sum(parts: list[WholeProduct]) -> WholeProduct:
    """The whole product's summary and valid configs, from its parts in the product's order."""
    reasons: dict[str, int] = {}
    for part in parts:
        for reason, n in part.summary.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    summary = SpaceSummary(sum(p.summary.total for p in parts), sum(p.summary.valid for p in parts), reasons)
    return WholeProduct(summary, [config for part in parts for config in part.valid])


@functools.lru_cache(maxsize=None)
def whole_product(family_name: str, problem: Problem) -> WholeProduct:
    """Every config of ``family_name``'s product checked against ``problem`` on an H100."""
    size = math.prod(len(p.choices) for p in get_family(family_name).params)
    bounds = _bounds(size, cores.count())
    futures = [cores.pool().submit(_part, family_name, problem, start, stop) for start, stop in bounds]
    return _sum([future.result() for future in futures])
