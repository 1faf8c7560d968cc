"""Faults on a real GPU: a study of the fault family (docs/examples/faults) meets each fault once,
between healthy configs, and each ends as a failed trial of its kind while the study completes its
trials, replaces the workers the faults took down and measures healthy configs after each; the
time each fault cost is printed (``pytest -s``). Then ``tuner check``: compute-sanitizer's memcheck
finds the out-of-bounds write of the fault family's oob_write config, and memcheck, racecheck and
synccheck find nothing in the stored winner of a one-trial attention study.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_faults_gpu.py -s``. Skipped where no GPU is
visible; the ``tuner check`` tests are skipped where compute-sanitizer is not installed. About a
minute: the infinite loop costs its 10 s measure timeout, each replaced worker a few seconds.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
FAULTS = str(ROOT / "docs" / "examples" / "faults")
SHAPE = "1048576"
MEASURE_TIMEOUT_S = 10.0
REPLACED = ("crash", "timeout", "worker")  # the failures after which a GPU worker is replaced


@pytest.fixture(scope="module")
def serial_ray():
    """One Ray for the module with one CPU: the configs compile one at a time, so they reach the
    GPU in the order the study asked them (healthy, fault, healthy, ...)."""
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is up in this process already, with its own CPU count")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def fault_study(serial_ray, tmp_path_factory):
    import tuner

    db = f"sqlite:///{tmp_path_factory.mktemp('faults') / 'faults.db'}"
    start = time.monotonic()
    result = tuner.tune(FAULTS, SHAPE, "fp32", trials=17, db=db, retime=0, seed=0,
                        measure_timeout_s=MEASURE_TIMEOUT_S)
    seconds = time.monotonic() - start
    detail = tuner.show(result.study, db=db)
    return result, detail, db, seconds


def _expected() -> dict[str, str]:
    from templates import get_family

    family = get_family(FAULTS)
    return importlib.import_module(type(family).__module__).EXPECTED


def test_every_fault_fails_with_its_kind_and_the_study_goes_on(fault_study):
    from tuner.study.faults import fault_rows, fault_table

    result, detail, _, seconds = fault_study
    by_fault = {t.params["FAULT"]: t for t in detail.trials if t.params["FAULT"] != "none"}
    print(f"\nfault study: {seconds:.1f} s, {result.measured} trials, {result.failed} failed")
    for line in fault_table(fault_rows(result.faults, key=lambda c: c.params["FAULT"])):
        print(line)
    for fault, trial in sorted(by_fault.items()):
        print(f"  {fault:<14} {trial.failure:<9} {trial.reason}")
    assert result.status == "finished" and result.measured == 17 and len(detail.trials) == 17
    for fault, kind in _expected().items():
        trial = by_fault[fault]
        assert (trial.status, trial.failure) == ("failed", kind), (fault, trial.failure, trial.reason)
        assert trial.reason and "\n" not in trial.reason
    healthy = [t for t in detail.trials if t.params["FAULT"] == "none"]
    assert len(healthy) == 9 and all(t.status == "ok" and t.error < 1e-6 for t in healthy)
    assert result.best is not None and result.best.params["FAULT"] == "none"


def test_healthy_configs_are_measured_after_each_fault(fault_study):
    _, detail, _, _ = fault_study
    stored = sorted(detail.trials, key=lambda t: (t.created_at, t.number))
    for i, trial in enumerate(stored):
        if trial.status == "failed":
            assert any(later.status == "ok" for later in stored[i + 1:]), \
                f"nothing measured after {trial.params['FAULT']} ({trial.failure})"


def test_dead_workers_are_replaced_and_the_time_lost_is_counted(fault_study):
    result, _, _, _ = fault_study
    assert len(result.faults) == result.failed == 8
    for cost in result.faults:
        assert cost.wall_s > 0 and cost.lost_s == pytest.approx(cost.wall_s + cost.replace_s)
        if cost.failure in REPLACED:
            assert cost.replaced >= 1 and cost.replace_s > 0, cost
        else:
            assert cost.replaced == 0, cost
    hang = next(c for c in result.faults if c.failure == "timeout")
    assert hang.wall_s >= MEASURE_TIMEOUT_S


def _sanitizer():
    from workers.sanitizer import find_sanitizer

    found = find_sanitizer()
    if found is None:
        pytest.skip("compute-sanitizer is not installed")
    return found


def _table(results) -> str:
    from tuner.cli.check import table

    return "\n".join(table(results))


def test_memcheck_finds_the_out_of_bounds_write(fault_study):
    import tuner

    _sanitizer()
    result, detail, db, _ = fault_study
    oob = next(t.number for t in detail.trials if t.params["FAULT"] == "oob_write")
    (checked,) = tuner.check(result.study, trial=oob, tools=["memcheck"], family=FAULTS, db=db, timeout_s=120)
    print("\n" + _table([checked]))
    (report,) = checked.reports
    assert report.complete and report.errors >= 1 and not checked.clean, _table([checked])
    assert any(kind.startswith("Invalid __global__ write") for kind in report.kinds), report.kinds


def test_the_winner_of_a_tiny_attention_study_is_clean_under_every_tool(serial_ray, tmp_path):
    import tuner

    _sanitizer()
    db = f"sqlite:///{tmp_path / 'attention.db'}"
    study = tuner.tune("attention", "1,2,128,64", "fp16", {"causal": True}, trials=1, db=db, retime=0)
    assert study.best is not None, study
    results = tuner.check(study.study, db=db, timeout_s=180)
    print("\n" + _table(results))
    (checked,) = results
    assert [r.tool for r in checked.reports] == ["memcheck", "racecheck", "synccheck"]
    assert all(r.complete and r.outcome == "ok" for r in checked.reports), _table(results)
    assert checked.clean, _table(results)
