"""Every config of a family's whole product checked against one problem, once per test session.

Attention's product holds 7.3 million configs and gemm's 2.2 million; checking them all costs
about 35 s and 10 s a problem on the 2-core CI machine. The tests that need the whole product
(each rejection has a known reason, the valid configs are those the family enumerates, the
space's summary adds up) share one pass a problem: ``summarize_space`` over the family, with each
config ``check`` accepts kept on the way, in the product's order.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from templates import get_family
from templates.family import H100_LIMITS, Problem, SpaceSummary, summarize_space


class WholeProduct(NamedTuple):
    summary: SpaceSummary  # what summarize_space counted
    valid: list[dict[str, Any]]  # every config check accepted, as KernelFamily.valid_configs lists them


class _Keeping:
    """The family as summarize_space sees it (``configs`` and ``check``), keeping each config
    ``check`` accepts."""

    def __init__(self, family: Any) -> None:
        self.family = family
        self.valid: list[dict[str, Any]] = []

    def configs(self):
        return self.family.configs()

    def check(self, config, problem, device):
        reason = self.family.check(config, problem, device)
        if reason is None:
            self.valid.append(config)
        return reason


@functools.lru_cache(maxsize=None)
def whole_product(family_name: str, problem: Problem) -> WholeProduct:
    """Every config of ``family_name``'s product checked against ``problem`` on an H100."""
    keeping = _Keeping(get_family(family_name))
    summary = summarize_space(keeping, problem, H100_LIMITS)
    return WholeProduct(summary, keeping.valid)
