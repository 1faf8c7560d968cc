"""What faults cost a study (tuner.study.faults): each failed trial's wall time from submission to its
failed result, plus the worker replacements the pool says it caused, per failure kind; on a fake
pool with real Optuna and storage, through the API and the command line."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

import tuner
from storage import open_repository
import tuner.cli.commands as cli
from tuner.study.faults import FaultCost, fault_rows, fault_table
from tuner_doubles import PROBLEM, FakePool, failure_of

REPLACING = ("crash", "timeout", "worker")  # the failures after which a GPU worker is replaced
REPLACE_S = 2.5


class Replaced(NamedTuple):
    ticket: int | None
    why: str
    seconds: float
    ready: bool = True


class ReplacingPool(FakePool):
    """A FakePool that, as WorkerPool does, says which tickets took a worker down and how long
    its replacement took (one re-timing replacement, for no ticket, too)."""

    def __init__(self) -> None:
        super().__init__()
        self.tickets: dict[int, dict[str, Any]] = {}

    def submit(self, ticket, params, source, launch, options) -> None:
        super().submit(ticket, params, source, launch, options)
        self.tickets[ticket] = dict(params)

    def replacements(self) -> list[Replaced]:
        return [Replaced(None, "re-timing", 99.0)] + [
            Replaced(t, failure_of(p), REPLACE_S) for t, p in self.tickets.items() if failure_of(p) in REPLACING]


def test_each_failed_trial_is_costed_and_its_replacements_added(toy, db, pools):
    pools.queued.append(ReplacingPool())
    result = tuner.tune("toy", *PROBLEM, trials=72, sampler="grid", db=db, seed=0, retime=0)
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    failed = {t.number: t for t in repo.trials(study.id) if t.status == "failed"}
    assert result.failed == len(failed) == len(result.faults) > 0
    assert {f.failure for f in result.faults} >= set(REPLACING)
    for fault in result.faults:
        stored = failed[fault.number]
        assert (fault.failure, fault.reason, fault.params) == (stored.failure, stored.reason, stored.params)
        assert 0 <= fault.wall_s < 60
        assert fault.replace_s == (REPLACE_S if fault.failure in REPLACING else 0.0)
        assert fault.replaced == (1 if fault.failure in REPLACING else 0)
        assert fault.lost_s == pytest.approx(fault.wall_s + fault.replace_s)
    rows = {row.kind: row for row in fault_rows(result.faults)}
    assert sum(row.trials for row in rows.values()) == len(failed)
    assert rows["crash"].replace_s == REPLACE_S * rows["crash"].trials and rows["compile"].replaced == 0


def test_a_run_without_failures_has_no_fault_lines(toy, db, pools, capsys):
    # the grid's seeded order: its first three configs are not among the toy's failing ones
    # (WARPS=4 with STAGES=2, tuner_doubles.failure_of); unseeded, a failing one came 1 in 4 runs
    argv = ["tune", "toy", "--shape", PROBLEM[0], "--dtype", PROBLEM[1], "--trials", "3", "--sampler", "grid",
            "--seed", "1", "--warm-start", "0", "--retime", "0", "--db", db]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "(0 failed)" in out and "faults" not in out and "| fault |" not in out


def test_the_table_sums_per_kind_costliest_first():
    costs = [FaultCost.of(1, "timeout", "ran past 10 s", 10.5, {}, [2.0]),
             FaultCost.of(2, "crash", "CUDA_ERROR_LAUNCH_FAILED during synchronize", 0.5, {}, [1.5]),
             FaultCost.of(3, "crash", "CUDA_ERROR_ILLEGAL_ADDRESS during synchronize", 0.25, {}, [1.25]),
             FaultCost.of(4, "compile", "nvcc failed", 0.75, {})]
    rows = fault_rows(costs)
    assert [r.kind for r in rows] == ["timeout", "crash", "compile"]
    assert (rows[1].trials, rows[1].wall_s, rows[1].replaced, rows[1].replace_s, rows[1].lost_s) == \
        (2, 0.75, 2, 2.75, 3.5)
    lines = fault_table(rows)
    assert lines[0] == "| fault | trials | wall s | replaced | replace s | lost s |"
    assert lines[2] == "| timeout | 1 | 10.5 | 1 | 2.0 | 12.5 |"
    assert lines[-1] == "| total | 4 | 12.0 | 3 | 4.8 | 16.8 |"
    by_param = fault_rows(costs, key=lambda c: str(c.number % 2))
    assert {r.kind: r.trials for r in by_param} == {"0": 2, "1": 2}


def test_tune_prints_the_table_and_json_carries_the_costs(toy, db, pools, capsys):
    import json

    pools.queued.append(ReplacingPool())
    argv = ["tune", "toy", "--shape", PROBLEM[0], "--dtype", PROBLEM[1], "--trials", "72",
            "--sampler", "grid", "--retime", "0", "--db", db]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "faults    time lost per failure kind" in out
    assert "| fault | trials | wall s | replaced | replace s | lost s |" in out and "| total |" in out
    crash = next(line for line in out.splitlines() if line.strip().startswith("| crash |"))
    assert crash.split("|")[4].strip() != "0"  # workers replaced
    pools.queued.append(ReplacingPool())
    assert cli.main([*argv, "--json"]) == 0  # the study is at its budget: nothing more fails
    assert json.loads(capsys.readouterr().out)["faults"] == []
