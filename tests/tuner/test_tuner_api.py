"""best, export, studies and show on what a (faked) tune stored."""

from __future__ import annotations

import json
import math

import pytest

import tuner
from tuner_doubles import PROBLEM, failure_of, latency_ms, valid_configs


def _fastest_ok(family):
    ok = [c for c in valid_configs(family) if failure_of(c) is None]
    return min(ok, key=latency_ms)


def test_best_returns_the_fastest_validated_config(toy, db, tuned):
    winner = tuner.best("toy", *PROBLEM, db=db)
    assert winner.params == _fastest_ok(toy)
    assert winner.median_ms == pytest.approx(latency_ms(winner.params))
    assert winner.tflops > 0 and winner.device.name == "NVIDIA H100 80GB HBM3"
    assert winner.template_hash == toy.template_hash and winner.study == tuned.result.study
    assert tuner.best("toy", "2,4,1024,64", "fp16", db=db, device="NVIDIA H100 80GB HBM3") == winner


def test_best_with_nothing_stored_is_not_found(toy, empty_db):
    with pytest.raises(tuner.NotFound, match="no validated result stored for toy 2x4x1024x64-fp16"):
        tuner.best("toy", *PROBLEM, db=empty_db)
    with pytest.raises(tuner.NotFound):
        tuner.best("toy", *PROBLEM, {"causal": True}, db=empty_db)


def test_export_writes_source_and_launch_json(toy, db, tuned, tmp_path):
    out = tmp_path / "out"
    path = tuner.export("toy", *PROBLEM, out_dir=out, db=db)
    winner = tuner.best("toy", *PROBLEM, db=db)
    problem = toy.parse_problem(*PROBLEM)
    assert path == out / "toy_2x4x1024x64-fp16.cu"
    assert path.read_text() == toy.render(winner.params, problem)
    launch = json.loads((out / "toy_2x4x1024x64-fp16.launch.json").read_text())
    expected = toy.launch(winner.params, problem)
    assert launch["kernel"] == "toy_kernel" and launch["source"] == path.name
    assert launch["grid"] == list(expected.grid) and launch["block"] == list(expected.block)
    assert launch["dynamic_smem_bytes"] == expected.smem_bytes
    assert launch["args"] == [{"kind": "buffer", "value": "q"}, {"kind": "buffer", "value": "out"},
                              {"kind": "i32", "value": 1024}]
    assert launch["compile_flags"][:2] == ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert "-O3" in launch["compile_flags"]
    assert launch["params"] == winner.params
    assert launch["measured"]["median_ms"] == winner.median_ms
    assert launch["measured"]["tflops"] == winner.tflops and launch["measured"]["error"] == 1e-3
    assert launch["gpu"] == "NVIDIA H100 80GB HBM3" and launch["toolkit"] == "nvcc 13.0.88"
    assert launch["template_hash"] == toy.template_hash
    assert launch["problem"] == {"shape": [2, 4, 1024, 64], "dtype": "fp16", "flags": {"causal": False}}
    assert launch["measured_at"].startswith("20")
    # named after its problem, so exports of several problems can share a folder
    assert sorted(p.name for p in out.iterdir()) == [path.name, "toy_2x4x1024x64-fp16.launch.json"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_exports_are_written_with_the_mode_of_any_new_file(toy, db, tuned, tmp_path, umask):
    import os
    import stat

    before = os.umask(umask)
    try:
        path = tuner.export("toy", *PROBLEM, out_dir=tmp_path / "out", db=db)
    finally:
        os.umask(before)
    for written in (path, path.with_suffix(".launch.json")):
        assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~umask, written


def test_export_refuses_a_winner_of_another_template_version(toy, db, tuned, tmp_path):
    (toy.folder / "kernel.cu.j2").write_text("__global__ void toy_kernel() { /* v2 */ }\n")
    with pytest.raises(tuner.TemplateMismatch, match="tune again"):
        tuner.export("toy", *PROBLEM, out_dir=tmp_path / "out", db=db)
    assert not (tmp_path / "out").exists()
    assert tuner.best("toy", *PROBLEM, db=db).params == _fastest_ok(toy)  # still readable


def test_studies_and_show(toy, db, tuned):
    (summary,) = tuner.studies(db=db)
    assert summary.name == tuned.result.study and summary.status == "finished"
    assert summary.n_ok + summary.n_failed == summary.n_trials
    detail = tuner.show(tuned.result.study, db=db)
    assert detail.summary == summary
    assert [t.number for t in detail.trials] == sorted(t.number for t in detail.trials)
    with pytest.raises(tuner.NotFound, match="no study named 'nope'"):
        tuner.show("nope", db=db)


def test_tune_result_reports_the_winner(toy, db, tuned):
    assert tuned.result.status == "finished" and tuned.result.device == "NVIDIA H100 80GB HBM3"
    assert tuned.result.best.params == _fastest_ok(toy)
    assert tuned.result.gpu_busy_s > 0


def test_a_grid_study_counts_to_its_valid_configs_not_the_space(toy, db, tuned):
    from storage import open_repository

    valid = valid_configs(toy)
    (record,) = open_repository(db).studies()
    assert len(valid) < math.prod(len(p.choices) for p in toy.params)  # the toy space has invalid points
    # the study's target (its progress line and ETA count to it) is every valid config, once
    assert record.settings["trials"] == len(valid)
    assert tuned.result.measured == len(valid)  # failed ones included


def test_bad_inputs_are_usage_errors(toy, db):
    with pytest.raises(tuner.UsageError, match="unknown kernel family 'nope'"):
        tuner.best("nope", *PROBLEM, db=db)
    with pytest.raises(tuner.UsageError, match="malformed shape"):
        tuner.tune("toy", "2,4,x", "fp16", db=db)
    with pytest.raises(tuner.UsageError, match="unsupported dtype"):
        tuner.tune("toy", "2,4,1024,64", "fp64", db=db)
    with pytest.raises(tuner.UsageError, match="unknown sampler"):
        tuner.tune("toy", *PROBLEM, sampler="cmaes", db=db)
    with pytest.raises(tuner.UsageError, match="warm_start takes a number of problems, 0 or more, not -1"):
        tuner.tune("toy", *PROBLEM, warm_start=-1, db=db)
    with pytest.raises(tuner.UsageError, match="the measure timeout must be a positive number of seconds, not 0"):
        tuner.tune("toy", *PROBLEM, measure_timeout_s=0, db=db)
    with pytest.raises(tuner.DatabaseError, match="cannot open database"):
        tuner.studies(db="postgresql://nobody@127.0.0.1:1/x")


def test_record_landscape_writes_every_stored_trial(toy, db, tuned, tmp_path):
    from workers.replay import ReplayBench, load_landscape

    path = tuner.record_landscape(tuned.result.study, tmp_path / "land.json", db=db)
    landscape = load_landscape(path)
    stored = tuner.show(tuned.result.study, db=db).trials
    assert landscape.family == "toy" and landscape.problem == toy.parse_problem(*PROBLEM)
    assert landscape.device.name == "NVIDIA H100 80GB HBM3" and landscape.device.max_smem_per_block_optin > 0
    assert len(landscape.entries) == len(stored)
    by_key = landscape.lookup()
    for trial in stored:
        recorded = by_key[json.dumps(trial.params, sort_keys=True)]
        assert recorded.ok == (trial.status == "ok")
        if trial.status == "ok":
            assert recorded.timing.median_ms == trial.median_ms
        else:
            assert recorded.failure == trial.failure
    bench = ReplayBench(path)
    answered = bench.measure(None, None, "toy", landscape.problem, params=stored[0].params)
    assert answered.replayed and answered.ok == (stored[0].status == "ok")
    with pytest.raises(tuner.NotFound, match="no study named"):
        tuner.record_landscape("nope", tmp_path / "x.json", db=db)
