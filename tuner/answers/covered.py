"""Coverage: which problems of a family are tuned, on which GPU and template version, how fast,
how long ago; and how well the rule that answers the others does (:mod:`tuner.answers.rule`).

    report = tuner.coverage("attention")
    for row in report.rows:
        print(row.problem, row.device, row.median_ms, row.age_s)
    print(report.rule.median, report.rule.worst)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from templates.family import KernelFamily
from tuner import api, database, lookup
from tuner.answers import rule as rules
from tuner.study.progress import format_seconds


@dataclass(frozen=True)
class CoverageRow:
    """One tuned problem on one GPU and template version: its stored best."""

    problem: str  # its key
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]
    device: str
    template_hash: str
    current: bool  # the family's template version now
    study: str
    trials: int  # measured trials of the study
    median_ms: float
    tflops: float | None
    retimed: bool
    replayed: bool
    measured_at: datetime
    age_s: float  # since the winning trial was measured
    peers: dict[str, float] = field(default_factory=dict)  # speed-up over each peer, where stored


@dataclass(frozen=True)
class Coverage:
    family: str
    template_hash: str  # the current one
    rows: tuple[CoverageRow, ...]
    rule: rules.RuleScore
    peers_note: str = "ratios to peers are not stored (`tuner bench` prints them)"


def coverage(family: str | KernelFamily, *, db: str | None = None) -> Coverage:
    """Every stored best of the family, by problem, GPU and template version, with the rule's
    leave-one-out score over them."""
    fam = lookup.family(family)
    with database.repository(database.url(db), create=False) as repo:
        return coverage_in(repo, fam)


def rule_score_in(repo: Any, fam: KernelFamily) -> rules.RuleScore:
    """The any-shape rule's leave-one-out score over the family's stored bests: each best's
    problem answered by the rule from the others, its pick's time read from that problem's
    measured trials (the costly part of coverage: every such study's trials)."""
    bests = database.call(lambda: repo.bests(fam.name))
    return _score(repo, fam, bests, {s.name: s for s in database.call(repo.studies)})


def _score(repo: Any, fam: KernelFamily, bests: list[Any], summaries: dict[str, Any]) -> rules.RuleScore:
    """:func:`rule_score_in` of the bests and study summaries read already."""
    measured: dict[str, dict[str, Any]] = {}

    def trials_of(study: str) -> dict[str, Any]:
        if study not in measured:
            measured[study] = database.call(lambda: repo.measured(summaries[study].id))
        return measured[study]

    return rules.leave_one_out(fam, bests, api.device_limits(list(summaries.values())), trials_of)


def coverage_in(repo: Any, fam: KernelFamily, *, score: rules.RuleScore | None = None) -> Coverage:
    """:func:`coverage` on an open ``storage.Repository``; ``score``: the rule's, read already
    (``rule_score_in``), else read here."""
    bests = database.call(lambda: repo.bests(fam.name))
    summaries = {s.name: s for s in database.call(repo.studies)}
    if score is None:
        score = _score(repo, fam, bests, summaries)
    current = fam.template_hash  # read once: it hashes the family's files
    now = datetime.now(timezone.utc)
    rows = []
    for best in bests:
        when = best.measured_at if best.measured_at.tzinfo else best.measured_at.replace(tzinfo=timezone.utc)
        rows.append(CoverageRow(
            problem=rules.problem_of(best).key, shape=tuple(best.shape), dtype=best.dtype,
            flags=dict(best.flags), device=best.device.name, template_hash=best.template_hash,
            current=best.template_hash == current, study=best.study,
            trials=summaries[best.study].n_trials, median_ms=best.median_ms, tflops=best.tflops,
            retimed=best.retime is not None, replayed=best.replayed, measured_at=best.measured_at,
            age_s=max(0.0, (now - when).total_seconds()),
        ))
    rows.sort(key=lambda r: (not r.current, r.device, r.dtype, sorted(r.flags.items()), r.shape))
    return Coverage(fam.name, current, tuple(rows), score)


def aged(report: Coverage) -> Coverage:
    """``report`` with each row's age counted now."""
    now = datetime.now(timezone.utc)

    def since(row: CoverageRow) -> float:
        when = row.measured_at if row.measured_at.tzinfo else row.measured_at.replace(tzinfo=timezone.utc)
        return max(0.0, (now - when).total_seconds())

    return replace(report, rows=tuple(replace(row, age_s=since(row)) for row in report.rows))


def age(seconds: float) -> str:
    """``45s``, ``12m03s``, ``5h10m``, ``3d04h``."""
    days, rest = divmod(int(seconds), 86400)
    return f"{days}d{rest // 3600:02d}h" if days else format_seconds(seconds)


def table(report: Coverage) -> list[str]:
    """``tuner coverage``'s lines: a markdown table, then the rule's leave-one-out line."""
    if not report.rows:
        return [f"no problem of {report.family} is tuned yet (tuner tune or tuner tune-many)",
                rules.score_line(report.rule)]
    head = ["problem", "GPU", "template", "trials", "best", "TFLOPS", "vs peers", "age"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report.rows:
        version = row.template_hash + (" (current)" if row.current else "")
        best = f"{row.median_ms:.4f} ms" + (" re-timed" if row.retimed else "") + (
            " replayed" if row.replayed else "")
        peers = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in sorted(row.peers.items()))
        cells = [row.problem, row.device, version, str(row.trials), best,
                 f"{row.tflops:.1f}" if row.tflops is not None else "-", peers, age(row.age_s)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [report.peers_note, rules.score_line(report.rule)]
