"""A whole study on two GPUs through real Ray actors: replay workers recorded on an H200 stand in
for two GPUs of one model, the second 4% slower (``WorkerPool(replay_gpus=...)``, a test-only
option given here through the pool seam of ``tuner.api``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import tuner
import tuner.api
from storage import open_repository
from tuner_doubles import LANDSCAPE
from workers.replay import load_landscape

PROBLEM = ("attention", "2,8,1024,64", "fp16", {"causal": True})


@pytest.fixture
def two_replayed_gpus(monkeypatch):
    """Two replay GPUs, called through a node agent (``workers.agent``) as every pool's are."""
    opened = []
    original = tuner.api._open_pool

    def open_pool(fam, problem, where):
        opened.append(where)
        return original(fam, problem, replace(where, replay_gpus=(1.0, 1.04), calibrate_every=3))

    monkeypatch.setattr(tuner.api, "_open_pool", open_pool)
    return opened


def test_a_study_on_two_gpus_is_one_set_of_timings(two_replayed_gpus, tmp_path, module_ray):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    result = tuner.tune(*PROBLEM, trials=40, replay=LANDSCAPE, db=db, seed=1)
    assert two_replayed_gpus and result.status == "finished" and result.measured == 40
    recorded = load_landscape(LANDSCAPE).lookup()
    trials = tuner.show(result.study, db=db).trials
    ok = [t for t in trials if t.ok]
    assert {t.gpu_uuid for t in trials} == {"GPU-replay-0", "GPU-replay-1"}
    for t in ok:  # each one normalized: the first ones of GPU 1 waited for its first round
        true = recorded[json.dumps(t.params, sort_keys=True)].timing.median_ms
        assert t.median_ms == pytest.approx(true * (1.04 if t.gpu_index == 1 else 1.0), rel=1e-12)
        assert t.gpu_ratio is not None and t.normalized_ms == pytest.approx(true, rel=1e-9)
    repo = open_repository(db)
    study = next(s for s in repo.studies() if s.name == result.study)
    retimes = repo.retimes(study.id)
    assert retimes and all(r.gpu_state["gpu"]["uuid"] == "GPU-replay-0" for r in retimes)
    fastest = min(ok, key=lambda t: recorded[json.dumps(t.params, sort_keys=True)].timing.median_ms)
    assert result.best.params == fastest.params
