"""The Repository's behaviour, the same on every backend."""

from __future__ import annotations

import dataclasses
from datetime import timezone

import pytest

from storage import BestRecord, StorageError, StudyRecord, TrialOutcome, TrialRecord, params_key

OK = {"status": "ok", "tflops": 100.0, "error": 1e-3, "max_abs_error": 2e-3}


def _ok(repo, study, number, median_ms, **extra):
    values = {**OK, "median_ms": median_ms, **extra}
    return repo.record_trial(study.id, number, {"block_m": 64, "n": number}, TrialOutcome(**values))


# -- reference rows ------------------------------------------------------------------------


def test_ensure_returns_the_same_id_for_the_same_row(repo, device):
    first = repo.ensure_device(**device)
    assert repo.ensure_device(**{**device, "compute_capability": (9, 0)}) == first
    assert repo.ensure_device(**{**device, "driver_version": "580.1"}) != first

    version = repo.ensure_template_version("attention", "aaaa", {"x": [1, 2]})
    assert repo.ensure_template_version("attention", "aaaa", {"x": [1, 2]}) == version
    assert repo.ensure_template_version("attention", "bbbb", {"x": [1, 2]}) != version
    assert repo.ensure_template_version("gemm", "aaaa", {}) != version

    problem = repo.ensure_problem("attention", [1, 2, 3], "fp16", {"causal": False})
    assert repo.ensure_problem("attention", (1, 2, 3), "fp16", {"causal": False}) == problem
    assert repo.ensure_problem("attention", [1, 2, 3], "fp16", {"causal": True}) != problem
    assert repo.ensure_problem("attention", [1, 2, 3], "bf16", {"causal": False}) != problem
    assert repo.ensure_problem("attention", [3, 2, 1], "fp16", {"causal": False}) != problem


# -- studies -------------------------------------------------------------------------------


def test_open_study_round_trip(repo, study_args):
    args = study_args(device={**study_args()["device"], "uuid": "GPU-1", "clocks": {"sm": 1980}})
    study = repo.open_study("s", **args)
    assert isinstance(study, StudyRecord)
    assert (study.name, study.family, study.template_hash) == ("s", "attention", "0123456789abcdef")
    assert study.space == args["space"] and study.settings == args["settings"]
    assert (study.shape, study.dtype, study.flags) == ((4, 16, 4096, 128), "fp16", {"causal": True})
    assert study.device.name == "NVIDIA H100 80GB HBM3" and study.device.compute_capability == "9.0"
    assert (study.sampler, study.status, study.replay) == ("tpe", "running", False)
    assert study.created_at.tzinfo == timezone.utc
    with pytest.raises(dataclasses.FrozenInstanceError):
        study.status = "finished"  # type: ignore[misc]


def test_reopening_a_study_returns_it_running(repo, study_args):
    study = repo.open_study("s", **study_args())
    repo.set_study_status(study.id, "interrupted")
    assert repo.study("s").status == "interrupted"
    again = repo.open_study("s", **study_args(sampler="random", settings={"other": 1}))
    assert again.id == study.id and again.status == "running"
    assert again.sampler == "tpe" and again.settings == study.settings  # kept as created
    assert len(repo.studies()) == 1


def test_a_study_name_cannot_change_its_problem(repo, study_args):
    repo.open_study("s", **study_args())
    with pytest.raises(StorageError, match="another template version, problem or device"):
        repo.open_study("s", **study_args(shape=[1, 1, 128, 64]))
    with pytest.raises(StorageError, match="another"):
        repo.open_study("s", **study_args(template_hash="ffff"))


def test_open_study_needs_a_complete_device(repo, study_args):
    with pytest.raises(StorageError, match="a device needs cuda_version"):
        repo.open_study(
            "s",
            **study_args(
                device={
                    "name": "x",
                    "sm_count": 1,
                    "compute_capability": "9.0",
                    "driver_version": "1",
                }
            ),
        )
    assert repo.studies() == []


def test_study_status_values(repo, study_args):
    study = repo.open_study("s", **study_args())
    repo.set_study_status(study.id, "finished")
    assert repo.study("s").status == "finished"
    with pytest.raises(StorageError, match="unknown study status"):
        repo.set_study_status(study.id, "done")
    with pytest.raises(StorageError, match="no study with id"):
        repo.set_study_status(study.id + 100, "finished")


def test_summaries_count_trials(repo, study_args):
    empty = repo.open_study("empty", **study_args(dtype="bf16"))
    study = repo.open_study("busy", **study_args())
    _ok(repo, study, 0, 2.0, tflops=50.0)
    _ok(repo, study, 1, 1.0, tflops=100.0)
    repo.record_trial(study.id, 2, {"n": 2}, TrialOutcome(status="failed", failure="compile", reason="x"))
    summaries = {s.name: s for s in repo.studies()}
    assert [s.name for s in repo.studies()] == ["empty", "busy"]
    busy = summaries["busy"]
    assert (busy.n_trials, busy.n_ok, busy.n_failed) == (3, 2, 1)
    assert (busy.best_median_ms, busy.best_tflops) == (1.0, 100.0)
    assert (busy.family, busy.shape, busy.device_name) == (
        "attention",
        (4, 16, 4096, 128),
        "NVIDIA H100 80GB HBM3",
    )
    assert busy.updated_at >= busy.created_at
    blank = summaries["empty"]
    assert (blank.n_trials, blank.n_ok, blank.n_failed, blank.best_median_ms) == (0, 0, 0, None)
    assert repo.study("busy") == busy and blank.id == empty.id
    with pytest.raises(StorageError, match="no study named 'nope'"):
        repo.study("nope")


# -- trials --------------------------------------------------------------------------------


def test_trial_round_trip_keeps_every_field(repo, study_args):
    study = repo.open_study("s", **study_args())
    values = dict(
        status="ok",
        failure=None,
        reason=None,
        detail="ptxas info",
        registers=128,
        smem_static=1024,
        stack_bytes=0,
        spill_stores=0,
        spill_loads=0,
        cubin_hash="c0ffee",
        compile_seconds=1.5,
        median_ms=0.25,
        min_ms=0.24,
        max_ms=0.3,
        iqr_ms=0.01,
        repetitions=100,
        tflops=550.5,
        error=1e-4,
        max_abs_error=3e-3,
        replayed=True,
        gpu_state={"sm_clock_mhz": 1980, "temperature_c": 55},
    )
    params = {"block_n": 64, "block_m": 128, "stages": 2}
    stored = repo.record_trial(study.id, 7, params, TrialOutcome(**values))
    assert isinstance(stored, TrialRecord)
    (loaded,) = repo.trials(study.id)
    assert loaded == stored
    for name, value in values.items():
        assert getattr(loaded, name) == value, name
    assert (loaded.number, loaded.params, loaded.ok) == (7, params, True)
    assert loaded.created_at.tzinfo == timezone.utc


def test_failed_trial_round_trip(repo, study_args):
    study = repo.open_study("s", **study_args())
    repo.record_trial(
        study.id,
        0,
        {"a": 1},
        TrialOutcome(status="failed", failure="compile", reason="ptxas error", detail="log\nlines"),
    )
    (trial,) = repo.trials(study.id)
    assert (trial.ok, trial.failure, trial.reason, trial.detail) == (
        False,
        "compile",
        "ptxas error",
        "log\nlines",
    )
    assert trial.median_ms is None and trial.gpu_state is None and trial.replayed is False


def test_trials_are_ordered_and_measured_is_keyed_by_params(repo, study_args):
    study = repo.open_study("s", **study_args())
    for number in (2, 0, 1):
        repo.record_trial(
            study.id,
            number,
            {"b": number % 2, "a": 1},
            TrialOutcome(status="failed", failure="invalid", reason="r"),
        )
    assert [t.number for t in repo.trials(study.id)] == [0, 1, 2]
    measured = repo.measured(study.id)
    assert set(measured) == {params_key({"a": 1, "b": 0}), params_key({"a": 1, "b": 1})}
    assert measured[params_key({"b": 0, "a": 1})].number == 0  # the first of two equal configs
    assert params_key({"b": 1, "a": 2}) == params_key({"a": 2, "b": 1}) == '{"a": 2, "b": 1}'


def test_params_read_back_as_they_were_returned(repo, study_args):
    study = repo.open_study("s", **study_args())
    stored = repo.record_trial(study.id, 0, {"tile": (64, 32)}, TrialOutcome(status="failed", failure="x"))
    assert stored.params == {"tile": [64, 32]} and repo.trials(study.id) == [stored]
    assert stored.key in repo.measured(study.id)


def test_nan_floats_are_stored_as_unknown(repo, study_args):
    study = repo.open_study("s", **study_args())
    trial = _ok(repo, study, 0, 1.0, error=float("nan"))
    assert trial.error is None and repo.trials(study.id)[0].error is None


def test_bad_trials_are_refused_with_one_line(repo, study_args):
    study = repo.open_study("s", **study_args())
    with pytest.raises(StorageError, match="unknown trial status"):
        repo.record_trial(study.id, 0, {}, TrialOutcome(status="weird"))
    with pytest.raises(StorageError, match="finite median_ms"):
        repo.record_trial(study.id, 0, {}, TrialOutcome(status="ok"))
    with pytest.raises(StorageError, match="finite median_ms"):
        repo.record_trial(study.id, 0, {}, TrialOutcome(status="ok", median_ms=float("nan")))
    with pytest.raises(StorageError, match="no study with id"):
        repo.record_trial(study.id + 100, 0, {}, TrialOutcome(status="ok", median_ms=1.0))
    with pytest.raises(StorageError, match="params are not plain JSON"):
        repo.record_trial(study.id, 0, {"x": float("inf")}, TrialOutcome(status="ok", median_ms=1.0))
    with pytest.raises(StorageError, match="gpu_state are not plain JSON"):
        repo.record_trial(study.id, 0, {}, TrialOutcome(status="ok", median_ms=1.0, gpu_state={"t": object()}))
    assert (
        repo.trials(study.id) == []
        and repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True}) is None
    )


def test_a_trial_number_is_unique_per_study_and_failure_rolls_back(repo, study_args):
    study = repo.open_study("s", **study_args())
    other = repo.open_study("t", **study_args())
    first = _ok(repo, study, 0, 2.0)
    _ok(repo, other, 0, 3.0)  # the same number in another study is fine
    with pytest.raises(StorageError, match="cannot record trial 0 of study") as caught:
        _ok(repo, study, 0, 0.5)  # faster, but a duplicate: neither trial nor best is stored
    assert "\n" not in str(caught.value)
    assert repo.trials(study.id) == [first]
    best = repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
    assert best is not None and best.median_ms == 2.0 and best.study == "s"
    assert _ok(repo, study, 1, 1.0).number == 1  # the repository still works afterwards


# -- best ----------------------------------------------------------------------------------


def test_best_follows_only_faster_ok_trials(repo, study_args):
    study = repo.open_study("s", **study_args())
    problem = ("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
    assert repo.best(*problem) is None
    repo.record_trial(
        study.id, 0, {"n": 0}, TrialOutcome(status="failed", failure="wrong", reason="bad", median_ms=0.01)
    )  # a fast but wrong kernel never wins
    assert repo.best(*problem) is None
    _ok(repo, study, 1, 2.0)
    assert repo.best(*problem).trial_number == 1
    _ok(repo, study, 2, 3.0)  # slower
    _ok(repo, study, 3, 2.0)  # as fast: the first stays
    assert repo.best(*problem).trial_number == 1
    repo.record_trial(study.id, 4, {"n": 4}, TrialOutcome(status="failed", failure="timeout", reason="hang"))
    _ok(repo, study, 5, 1.5, registers=96, cubin_hash="beef", replayed=True)
    best = repo.best(*problem)
    assert isinstance(best, BestRecord)
    assert (best.trial_number, best.median_ms, best.params) == (5, 1.5, {"block_m": 64, "n": 5})
    assert (best.registers, best.cubin_hash, best.replayed, best.tflops) == (
        96,
        "beef",
        True,
        100.0,
    )
    assert (best.study, best.template_hash, best.device.sm_count) == ("s", "0123456789abcdef", 132)
    assert (best.shape, best.dtype, best.flags) == ((4, 16, 4096, 128), "fp16", {"causal": True})
    trial = {t.number: t for t in repo.trials(study.id)}[5]
    assert best.measured_at == trial.created_at


def test_best_is_kept_per_problem_and_across_studies(repo, study_args):
    one = repo.open_study("one", **study_args())
    two = repo.open_study("two", **study_args(sampler="random"))  # same problem, other study
    other = repo.open_study("other", **study_args(flags={"causal": False}))
    _ok(repo, one, 0, 2.0)
    _ok(repo, two, 0, 1.0)
    _ok(repo, one, 1, 1.5)  # faster than one's own, slower than the stored best
    _ok(repo, other, 0, 0.1)
    best = repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
    assert (best.study, best.median_ms) == ("two", 1.0)
    assert repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": False}).study == "other"
    assert repo.best("attention", [4, 16, 4096, 128], "bf16", {"causal": True}) is None
    assert repo.best("gemm", [4, 16, 4096, 128], "fp16", {"causal": True}) is None


def test_best_filters_by_device_and_template(repo, study_args, device):
    h100 = repo.open_study("h100", **study_args())
    h200 = repo.open_study("h200", **study_args(device={**device, "name": "NVIDIA H200"}))
    new = repo.open_study("new", **study_args(template_hash="ffff"))
    _ok(repo, h100, 0, 2.0)
    _ok(repo, h200, 0, 1.0)
    _ok(repo, new, 0, 3.0)
    problem = ("attention", (4, 16, 4096, 128), "fp16", {"causal": True})
    assert repo.best(*problem).device.name == "NVIDIA H200"  # fastest anywhere
    assert repo.best(*problem, device_name=device["name"]).study == "h100"
    assert repo.best(*problem, template_hash="ffff").study == "new"
    assert repo.best(*problem, device_name="NVIDIA H200", template_hash="ffff") is None


def test_bests_lists_every_problem_with_filters(repo, device):
    study = repo.open_study(
        "s1", family="attention", template_hash="t1", space={}, shape=[1, 2, 512, 64], dtype="fp16",
        flags={"causal": False}, device=device, sampler="tpe", replay=False, settings={},
    )
    other = repo.open_study(
        "s2", family="attention", template_hash="t1", space={}, shape=[1, 2, 1024, 64], dtype="bf16",
        flags={"causal": True}, device=device, sampler="tpe", replay=False, settings={},
    )
    repo.record_trial(study.id, 0, {"A": 1}, TrialOutcome(status="ok", median_ms=2.0))
    repo.record_trial(other.id, 0, {"A": 2}, TrialOutcome(status="ok", median_ms=1.0))
    repo.record_trial(other.id, 1, {"A": 3}, TrialOutcome(status="failed", failure="crash", reason="x"))
    found = repo.bests("attention")
    assert [b.params for b in found] == [{"A": 2}, {"A": 1}]  # fastest first, failed never
    assert [b.shape for b in repo.bests("attention", dtype="fp16")] == [(1, 2, 512, 64)]
    assert [b.flags for b in repo.bests("attention", flags={"causal": True})] == [{"causal": True}]
    assert repo.bests("attention", template_hash="t2") == [] and repo.bests("gemm") == []



# A on GPU 1 (0.96x the reference GPU 0), B on GPU 0: B's raw median is lower, A is faster on GPU 0
GPU_A = TrialOutcome(**OK, median_ms=1.144, normalized_ms=1.10, gpu_ratio=1.10 / 1.144, gpu_uuid="GPU-1",
                     gpu_index=1)
GPU_B = TrialOutcome(**OK, median_ms=1.12, normalized_ms=1.12, gpu_ratio=1.0, gpu_uuid="GPU-0", gpu_index=0)


@pytest.mark.parametrize("order", ["A first", "B first"])
@pytest.mark.parametrize("batched", [True, False], ids=["one record_trials", "one at a time"])
def test_with_several_gpus_the_best_is_the_fastest_on_the_reference_gpu(repo, study_args, batched, order):
    """Two GPUs' results, stored in one ``record_trials`` call or one trial at a time, in either
    order: the stored best is A, ranked by its normalized median, and the queries of the best,
    of each problem's best and of the study's summary agree."""
    study = repo.open_study("s", **study_args())
    results = [(0, {"block_m": 64}, GPU_A), (1, {"block_m": 128}, GPU_B)]
    if order == "B first":
        results.reverse()
    if batched:
        repo.record_trials(study.id, results)
    else:
        for number, params, outcome in results:
            repo.record_trial(study.id, number, params, outcome)
    best = repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True})
    assert (best.trial_number, best.params, best.median_ms) == (0, {"block_m": 64}, 1.10)
    assert best.tflops == pytest.approx(100.0 * 1.144 / 1.10)  # at the reference GPU's time
    assert [(b.trial_number, b.median_ms) for b in repo.bests("attention")] == [(0, 1.10)]
    assert repo.studies()[0].best_median_ms == 1.10
    assert min(repo.trials(study.id), key=lambda t: t.ranked_ms).number == 0


def test_a_problem_is_its_shape_dtype_and_flags(repo):
    first = repo.ensure_problem("mine", [1024, 64], "fp32", {"layout": "t", "bias": True})
    assert repo.ensure_problem("mine", (1024, 64), "fp32", {"bias": True, "layout": "t"}) == first  # key order
    others = {repo.ensure_problem("mine", [1024, 64], "fp32", {"layout": "n", "bias": True}),
              repo.ensure_problem("mine", [1024, 64], "fp32", {}),
              repo.ensure_problem("mine", [1024, 64], "bf16", {"layout": "t", "bias": True}),
              repo.ensure_problem("other", [1024, 64], "fp32", {"layout": "t", "bias": True})}
    assert len(others) == 4 and first not in others
