"""What a package of ``tuner export-torch`` asks of this project at run time: the any-shape rule's
pick for a problem its table does not hold, and that pick's kernel::

    choice = rule_choice(table, (300, 4096, 4096), "bf16", {"layout": "nt", "epilogue": "none"})
    if choice.use == "ours":
        kernel = rule_kernel(table, choice)          # a workers.loader.ExportedKernel
        c = kernel(a, b)                             # compiled on its first call, then cached

The pick is ``tuner best --device GPU``'s on the exported winners (``pick_config`` over the
table's rows, each checked under the limits of the GPU it won on). Where ``tuner guard`` timed
the package (its table has a ``guard`` stamp), the pick gives way to the vendor's path when the
nearest problem it timed (by the family's ``distance``: its tuned rows and its ``samples``
between them) says ``"use": "vendor"``. Neither torch nor a database is imported here; the
family's templates are, to check, render and launch the pick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from templates.family import DeviceLimits, KernelFamily, Problem, TemplateError
from tuner.errors import TunerError


class StaleTemplates(TunerError, ValueError):
    """The installed family's template version is not the one the package was exported from."""


@dataclass(frozen=True)
class Choice:
    """What an op runs for one problem: ``use`` "ours" (``params``, won on ``source``) or "vendor"."""

    use: str  # "ours" | "vendor"
    reason: str  # why, in a few words
    key: str | None = None  # the problem's key (None: the family does not take it)
    params: Mapping[str, Any] | None = None
    source: str | None = None  # the tuned problem whose winner it is (its own key where tuned)
    kernel: str | None = None  # the package's kernels/<stem> (tuned problems only)
    problem: Any = field(default=None, compare=False)  # the family's Problem (the rule's picks)


@dataclass(frozen=True)
class Winner:
    """A table row as ``tuner.answers.rule`` reads a stored best."""

    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]
    params: dict[str, Any]
    template_hash: str
    median_ms: float
    limits: DeviceLimits = field(compare=False)


def winners(table: Mapping[str, Any]) -> list[Winner]:
    found = []
    for row in table["problems"]:
        limits = dict(row["limits"])
        limits["compute_capability"] = tuple(limits["compute_capability"])
        found.append(Winner(tuple(row["shape"]), row["dtype"], dict(row["flags"]), dict(row["params"]),
                            row["template_hash"], float(row["median_ms"]), DeviceLimits(**limits)))
    return found


def rule_choice(table: Mapping[str, Any], shape: tuple[int, ...], dtype: str, flags: Mapping[str, Any]) -> Choice:
    """The rule's pick for a problem the table does not hold, or the vendor's path where the
    family does not take the problem, no config is valid for it, or the nearest problem the
    guard timed took the vendor's path (``guarded_choice``). StaleTemplates where the installed
    templates are not the export's (the pick's source would not be the measured one's)."""
    choice = rule_pick(table, shape, dtype, flags)
    if choice.use != "ours" or choice.kernel is not None or "guard" not in table:
        return choice
    return guarded_choice(table, choice)


def rule_pick(table: Mapping[str, Any], shape: tuple[int, ...], dtype: str, flags: Mapping[str, Any]) -> Choice:
    """``rule_choice`` without the guard's say: the pick the rule makes from the tuned rows
    (what ``tuner guard`` times at its samples)."""
    from templates import get_family
    from tuner.answers.rule import pick_config

    family = get_family(table["family"])
    try:
        problem = family.parse_problem(tuple(shape), dtype, dict(flags))
    except (TemplateError, ValueError) as error:
        return Choice("vendor", f"{family.name} does not take it: {str(error).splitlines()[0]}")
    exported = table["stamp"]["template_hash"]
    if family.template_hash != exported:
        raise StaleTemplates(f"the installed {family.name} templates ({family.template_hash}) are not the ones "
                             f"this package was exported from ({exported}): export it again")
    rows = winners(table)
    for row, winner in zip(table["problems"], rows):  # a tuned problem asked through its parsed form
        if (winner.shape, winner.dtype, tuple(sorted(winner.flags.items()))) == \
                (problem.shape, problem.dtype, problem.flags):
            return table_choice(row)
    pick = pick_config(family, problem, rows, lambda w: w.limits, rows[0].limits)
    if pick is None:
        return Choice("vendor", "no tuned config and no starting point is valid for it", problem.key)
    return Choice("ours", "the rule's pick (not measured for this shape)", problem.key, pick.params, pick.source,
                  problem=problem)


def guarded_choice(table: Mapping[str, Any], choice: Choice) -> Choice:
    """``choice`` (the rule's pick, "ours"), or the vendor's path where the problem the guard
    timed nearest to it (a tuned row or a sample, of its dtype and flags; a tie: the vendor's)
    took the vendor's path."""
    from templates import get_family

    nearest = nearest_timed(get_family(table["family"]), table, choice.problem)
    if nearest is None or nearest.get("use") != "vendor":
        return choice
    return Choice("vendor", f"the vendor's path measured faster at the nearest timed problem, {nearest['key']}",
                  choice.key, choice.params, choice.source, problem=choice.problem)


def nearest_timed(family: KernelFamily, table: Mapping[str, Any], problem: Problem) -> Mapping[str, Any] | None:
    """The row or sample of ``table`` that ``tuner guard`` timed nearest to ``problem`` by the
    family's ``distance`` (None: none at a finite distance); at one distance, one that says
    "vendor" first."""
    timed = [row for row in table["problems"] if "guard_reason" in row] + list(table.get("samples", ()))
    best, best_rank = None, (math.inf, True)
    for entry in timed:
        other = Problem(tuple(entry["shape"]), entry["dtype"], tuple(sorted(entry["flags"].items())))
        away = family.distance(other, problem)
        rank = (away, entry.get("use") != "vendor")
        if math.isfinite(away) and rank < best_rank:
            best, best_rank = entry, rank
    return best


def table_choice(row: Mapping[str, Any]) -> Choice:
    """A tuned problem's row: its winner, or the vendor's path where the row says so."""
    if row.get("use", "ours") == "vendor":
        return Choice("vendor", "the vendor's path measured faster here", row["key"], row["params"], row["key"])
    return Choice("ours", "tuned", row["key"], row["params"], row["key"], row["kernel"])


def rule_kernel(table: Mapping[str, Any], choice: Choice) -> Any:
    """The kernel of a rule's pick, rendered by the installed family for the problem
    (``workers.loader.ExportedKernel``: compiled on its first call, in the tuner's compile cache)."""
    from templates import get_family
    from tuner.answers.exporter import ARCH, tensors
    from workers.loader import ExportedKernel, TensorSpec

    family = get_family(table["family"])
    problem = choice.problem
    params = dict(choice.params or {})
    specs = tuple(TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["output"]) for t in tensors(family, problem))
    return ExportedKernel(f"{family.name}_{problem.key}", family.render(params, problem), ARCH,
                          tuple(family.compile_options(params, problem)), family.launch(params, problem), specs,
                          {"params": params, "source": choice.source})


__all__ = ["Choice", "StaleTemplates", "Winner", "guarded_choice", "nearest_timed", "rule_choice", "rule_kernel",
           "rule_pick", "table_choice", "winners"]
