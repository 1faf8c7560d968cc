"""What a package of ``tuner export-torch`` asks of this project at run time: the any-shape rule's
pick for a problem its table does not hold, and that pick's kernel::

    choice = rule_choice(table, (300, 4096, 4096), "bf16", {"layout": "nt", "epilogue": "none"})
    if choice.use == "ours":
        kernel = rule_kernel(table, choice)          # a workers.loader.ExportedKernel
        c = kernel(a, b)                             # compiled on its first call, then cached

The pick is ``tuner best --device GPU``'s on the exported winners (``pick_config`` over the
table's rows, each checked under the limits of the GPU it won on). Where ``tuner guard`` timed
the package (its table has a ``guard`` stamp), the pick stands only between problems of its own
line that the guard timed (tuned rows and ``samples``) with ours faster on both sides
(``guarded_choice``); elsewhere the vendor's path. Neither torch nor a database is imported here; the
family's templates are, to check, render and launch the pick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from templates.family import DeviceLimits, TemplateError
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
    """``choice`` (the rule's pick, "ours") where the guard timed the problem's own line on both
    sides of it and ours won at the nearest timed problem on each side (or at the problem itself);
    otherwise the vendor's path. A line: the tuned rows and samples of the problem's dtype and
    flags whose shapes differ from it in one dimension (a GEMM's token count, with N and K
    alike). Past the last timed problem of its line, or on a line the guard never timed, the
    vendor's path: a pick there was never measured against it."""
    problem = choice.problem
    timed = [row for row in table["problems"] if "guard_reason" in row] + list(table.get("samples", ()))
    below: dict[int, Mapping[str, Any]] = {}
    above: dict[int, Mapping[str, Any]] = {}
    for entry in timed:
        shape = tuple(int(d) for d in entry["shape"])
        if (entry["dtype"], tuple(sorted(entry["flags"].items()))) != (problem.dtype, problem.flags) \
                or len(shape) != len(problem.shape):
            continue
        differ = [axis for axis, (a, b) in enumerate(zip(shape, problem.shape)) if a != b]
        if not differ:
            return choice if entry.get("use") != "vendor" else _vendor(choice, entry, "at it")
        if len(differ) != 1:
            continue
        axis = differ[0]
        side = below if shape[axis] < problem.shape[axis] else above
        if axis not in side or abs(shape[axis] - problem.shape[axis]) < \
                abs(int(side[axis]["shape"][axis]) - problem.shape[axis]):
            side[axis] = entry
    brackets = [(below[axis], above[axis]) for axis in below if axis in above]
    if not brackets:
        return Choice("vendor", "the guard timed no problem on both sides of it: the rule's pick was not "
                      "measured against the vendor's path here", choice.key, choice.params, choice.source,
                      problem=problem)
    for low, high in brackets:
        for entry in (low, high):
            if entry.get("use") == "vendor":
                return _vendor(choice, entry, "beside it")
    return choice


def _vendor(choice: Choice, entry: Mapping[str, Any], where: str) -> Choice:
    return Choice("vendor", f"the vendor's path measured faster {where}, at {entry['key']}", choice.key,
                  choice.params, choice.source, problem=choice.problem)


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


__all__ = ["Choice", "StaleTemplates", "Winner", "guarded_choice", "rule_choice", "rule_kernel",
           "rule_pick", "table_choice", "winners"]
