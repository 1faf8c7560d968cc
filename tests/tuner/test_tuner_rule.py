"""The rule that answers `best` for a problem never tuned, and its leave-one-out score, on results
stored in a real SQLite file (through the Repository, as a study stores them) for a small family
whose constraints depend on the problem: BLOCK_M must divide the sequence length N."""

from __future__ import annotations

import json
from typing import Any, Mapping

import pytest

import tuner
from storage import TrialOutcome, open_repository
from templates.family import DeviceLimits, Problem
from tuner.cli.commands import main
from tuner_doubles import DEVICE, ToyFamily, registered

START = {"BLOCK_M": 16, "BLOCK_N": 16, "WARPS": 2, "STAGES": 1}


class FitFamily(ToyFamily):
    name = "toyfit"

    def check(self, params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
        if problem.shape[2] % params["BLOCK_M"]:
            return f"divisibility: BLOCK_M={params['BLOCK_M']} does not divide N={problem.shape[2]}"
        return super().check(params, problem, device)

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        return [p for p in [START] if self.check(p, problem, device) is None]


def config(block_m: int, block_n: int = 32, warps: int = 4, stages: int = 1) -> dict[str, Any]:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "WARPS": warps, "STAGES": stages}


@pytest.fixture
def fit(tmp_path):
    with registered(FitFamily, tmp_path / "toyfit") as family:
        yield family


def store(db: str, family: FitFamily, shape: tuple[int, ...], trials: list[tuple[dict, float | None]],
          dtype: str = "fp16", causal: bool = False) -> str:
    """A study of ``shape`` with these trials (median None: failed), as tune stores one."""
    problem = family.parse_problem(shape, dtype, {"causal": causal})
    name = f"toyfit/{problem.key}"
    with open_repository(db) as repo:
        record = repo.open_study(
            name, family=family.name, template_hash=family.template_hash,
            space={p.name: list(p.choices) for p in family.params}, shape=list(problem.shape),
            dtype=dtype, flags=dict(problem.flags), device=DEVICE.to_json(), sampler="tpe", replay=False,
            settings={"device": DEVICE.to_json()},
        )
        for number, (params, median) in enumerate(trials):
            outcome = (TrialOutcome("ok", median_ms=median, tflops=1.0) if median is not None
                       else TrialOutcome("failed", failure="launch", reason="launch failed"))
            repo.record_trial(record.id, number, params, outcome)
        repo.set_study_status(record.id, "finished")
    return name


def best_json(capsys, db: str, *argv: str) -> dict[str, Any]:
    assert main(["best", "toyfit", *argv, "--db", db, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_nearest_tuned_problems_winner_valid_here_is_picked_else_the_next_else_a_start(fit, db, capsys):
    store(db, fit, (2, 4, 1024, 64), [(config(64), 1.0), (config(32), 1.3)])  # winner BLOCK_M 64
    store(db, fit, (2, 4, 96, 64), [(config(32), 2.0), (config(16), 2.2)])  # winner BLOCK_M 32
    # N=160: nearest is N=96 (log2 1.67 away, against 2.68); its BLOCK_M=32 divides 160
    near = best_json(capsys, db, "--shape", "2,4,160,64", "--dtype", "fp16")
    assert (near["measured"], near["source"], near["params"]) == (False, "2x4x96x64-fp16", config(32))
    assert near["distance"] == pytest.approx(0.736965594)
    assert near["source_best"]["median_ms"] == 2.0 and near["passed_over"] == []
    # N=672: nearest is N=1024, whose BLOCK_M=64 does not divide 672: the next, N=96, is picked
    nxt = best_json(capsys, db, "--shape", "2,4,672,64", "--dtype", "fp16")
    assert (nxt["source"], nxt["params"]) == ("2x4x96x64-fp16", config(32))
    assert nxt["passed_over"] == ["2x4x1024x64-fp16: divisibility: BLOCK_M=64 does not divide N=672"]
    # N=80: neither winner divides it: the family's starting point
    start = best_json(capsys, db, "--shape", "2,4,80,64", "--dtype", "fp16")
    assert (start["source"], start["params"], start["source_best"]) == ("the family's starting point", START, None)
    assert len(start["passed_over"]) == 2
    # a tuned problem answers itself, measured
    own = best_json(capsys, db, "--shape", "2,4,96,64", "--dtype", "fp16")
    assert own["measured"] is True and own["source"] == "2x4x96x64-fp16" and own["median_ms"] == 2.0
    # the Python API says the same; derive=False refuses
    derived = tuner.best("toyfit", "2,4,160,64", "fp16", db=db)
    assert isinstance(derived, tuner.Derived) and derived.source == "2x4x96x64-fp16"
    with pytest.raises(tuner.NotFound, match="no validated result stored for toyfit 2x4x160x64-fp16"):
        tuner.best("toyfit", "2,4,160,64", "fp16", db=db, derive=False)


def test_same_dtype_and_flags_come_before_other_ones(fit, db, capsys):
    store(db, fit, (2, 4, 1024, 64), [(config(64), 1.0)], dtype="bf16")  # other dtype, same shape
    store(db, fit, (2, 4, 1024, 128), [(config(32), 1.0)])  # same dtype, another D: distance inf
    store(db, fit, (8, 8, 4096, 64), [(config(128, 16), 1.0)], causal=True)  # other flags
    pick = best_json(capsys, db, "--shape", "2,4,1024,64", "--dtype", "fp16")
    assert (pick["source"], pick["distance"]) == ("2x4x1024x128-fp16", None)
    # without it, the nearest shape of the others
    pick = best_json(capsys, db, "--shape", "8,8,4096,128", "--dtype", "bf16", "--causal")
    assert pick["source"] in ("2x4x1024x64-bf16", "8x8x4096x64-fp16-causal")
    assert pick["source"] == "8x8x4096x64-fp16-causal"  # same flags and B,H,S: nearest in shape


def test_nothing_tuned_of_the_family_is_still_not_found(fit, empty_db, capsys):
    assert main(["best", "toyfit", "--shape", "2,4,160,64", "--dtype", "fp16", "--db", empty_db]) == 2
    assert capsys.readouterr().err.startswith("tuner: error: no validated result stored for toyfit")


def test_leave_one_out_takes_each_picks_stored_time_over_that_problems_best(fit, db, capsys):
    w1, w2, w3, w4 = config(64), config(32), config(16, 16), config(128, 16)
    # N=1024 picks N=2048's winner (w2): stored there at 1.5x its best
    store(db, fit, (2, 4, 1024, 64), [(w1, 1.0), (w2, 1.5)])
    # N=2048 picks N=1024's (w1; N=4096 is as near, and after it by name): stored at 1.1x
    store(db, fit, (2, 4, 2048, 64), [(w2, 2.0), (w1, 2.2)])
    # N=4096 picks N=2048's (w2; nearer than N=16384): never measured there: unknown
    store(db, fit, (2, 4, 4096, 64), [(w3, 3.0), (w4, 3.3)])
    # N=16384 picks N=4096's (w3): it failed there
    store(db, fit, (2, 4, 16384, 64), [(w4, 4.0), (w3, None)])
    assert main(["coverage", "toyfit", "--db", db, "--json"]) == 0
    rule = json.loads(capsys.readouterr().out)["rule"]
    held = {h["problem"]: (h["source"], h["outcome"], h["ratio"]) for h in rule["held"]}
    assert held == {
        "2x4x1024x64-fp16": ("2x4x2048x64-fp16", "measured", 1.5),
        "2x4x2048x64-fp16": ("2x4x1024x64-fp16", "measured", pytest.approx(1.1)),
        "2x4x4096x64-fp16": ("2x4x2048x64-fp16", "unknown", None),
        "2x4x16384x64-fp16": ("2x4x4096x64-fp16", "failed", None),
    }
    assert (rule["median"], rule["worst"]) == (pytest.approx(1.3), 1.5)
    assert (rule["known"], rule["unknown"], rule["failed"]) == (2, 1, 1)
    assert main(["coverage", "toyfit", "--db", db]) == 0
    out = capsys.readouterr().out
    assert ("leave-one-out over 4 tuned problem(s): median 1.30x, worst 1.50x its best (2 known; "
            "1 unknown: the pick was never measured there; 1 failed there)") in out
    rows = [line for line in out.splitlines() if line.startswith("| 2x4x")]
    assert [r.split(" | ")[0] for r in rows] == ["| 2x4x1024x64-fp16", "| 2x4x2048x64-fp16",
                                                 "| 2x4x4096x64-fp16", "| 2x4x16384x64-fp16"]
    assert all(" | 2 | " in r and "(current)" in r for r in rows)


def test_coverage_of_a_family_with_nothing_tuned(fit, empty_db, capsys):
    assert main(["coverage", "toyfit", "--db", empty_db]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no problem of toyfit is tuned yet (tuner tune or tuner tune-many)",
        "rule: no tuned problems to measure it on"]
