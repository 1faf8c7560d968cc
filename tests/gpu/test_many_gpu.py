"""The problems of one list on the GPU: one pool of GPU workers serves them in turn, each problem
measured on its own inputs (``WorkerPool.retarget``).

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import pytest

import tuner
from tuner import api

pytestmark = pytest.mark.gpu

# of other sizes, so that a worker still holding the last problem's inputs fails every trial
SHAPES = ("256,384,512", "1000,264,136", "64,4096,1024")


def test_one_pool_of_gpus_measures_each_problem_of_a_list_on_its_own_inputs(tmp_path, monkeypatch):
    opened = []
    original = api._open_pool

    def counted(fam, problem, where):
        opened.append(problem.key)
        return original(fam, problem, where)

    monkeypatch.setattr(api, "_open_pool", counted)
    flags = {"layout": "nt"}
    problems = [tuner.lookup.family("gemm").parse_problem(shape, "bf16", flags) for shape in SHAPES]
    db = f"sqlite:///{tmp_path}/many.db"
    done = tuner.tune_many("gemm", problems, db=db, trials=6, retime=2, seed=1)
    assert len(opened) == 1  # the first problem's pool served the next ones
    for entry, shape in zip(done, SHAPES):
        assert entry.result.status == "finished" and entry.result.measured == 6
        detail = tuner.show(entry.result.study, db=db)
        ok = [t for t in detail.trials if t.status == "ok"]
        assert len(ok) >= 3, [(t.status, t.error) for t in detail.trials]
        assert all(t.error is not None and t.error < 2e-2 for t in ok)
        best = tuner.best("gemm", shape, "bf16", flags, db=db, derive=False)
        assert best.median_ms > 0 and best.retime is not None
