"""What faults cost a study: per failed trial, the wall time from its submission to the pool to its
failed result, plus the time to replace the GPU worker it took down (a crash, a hang, a dead
process); and those summed per kind of failure, as a table::

    result = tuner.tune(...)
    for line in fault_table(fault_rows(result.faults)):
        print(line)
    # | fault | trials | wall s | replaced | replace s | lost s |
    # | timeout | 1 | 10.4 | 1 | 2.1 | 12.5 |

The wall time counts everything the trial waited for (its compile, the queue before the GPU),
as the brief of the table is what the study spent on the config, not the GPU alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence


@dataclass(frozen=True)
class FaultCost:
    """One failed trial of a run and what it cost."""

    number: int  # the trial's number in its study
    failure: str  # workers.results.FAILURE_KINDS
    reason: str
    wall_s: float  # from its submission to the pool to its failed result
    replace_s: float = 0.0  # replacing the GPU workers it took down, until the new one was ready
    replaced: int = 0  # GPU workers replaced for it
    params: dict[str, Any] = field(default_factory=dict)
    lost_s: float = 0.0  # wall_s + replace_s

    @classmethod
    def of(cls, number: int, failure: str, reason: str, wall_s: float, params: dict[str, Any],
           replacements: Sequence[float] = ()) -> "FaultCost":
        replace_s = float(sum(replacements))
        return cls(number, failure, reason, wall_s, replace_s, len(replacements), dict(params),
                   wall_s + replace_s)


@dataclass(frozen=True)
class FaultRow:
    """The failed trials of one kind (or of one key) together."""

    kind: str
    trials: int
    wall_s: float
    replaced: int
    replace_s: float
    lost_s: float


def fault_rows(costs: Iterable[FaultCost], key: Callable[[FaultCost], str] | None = None) -> list[FaultRow]:
    """``costs`` summed by ``key`` (the failure kind by default), the costliest first."""
    groups: dict[str, list[FaultCost]] = {}
    for cost in costs:
        groups.setdefault(key(cost) if key else cost.failure, []).append(cost)
    rows = [FaultRow(kind, len(group), sum(c.wall_s for c in group), sum(c.replaced for c in group),
                     sum(c.replace_s for c in group), sum(c.lost_s for c in group))
            for kind, group in groups.items()]
    return sorted(rows, key=lambda r: (-r.lost_s, r.kind))


def fault_table(rows: Sequence[FaultRow], label: str = "fault") -> list[str]:
    """Markdown lines: a row per kind and their total."""
    lines = [f"| {label} | trials | wall s | replaced | replace s | lost s |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.trials} | {r.wall_s:.1f} | {r.replaced} | {r.replace_s:.1f} | {r.lost_s:.1f} |")
    if len(rows) > 1:
        lines.append(f"| total | {sum(r.trials for r in rows)} | {sum(r.wall_s for r in rows):.1f} | "
                     f"{sum(r.replaced for r in rows)} | {sum(r.replace_s for r in rows):.1f} | "
                     f"{sum(r.lost_s for r in rows):.1f} |")
    return lines


__all__ = ["FaultCost", "FaultRow", "fault_rows", "fault_table"]
