"""The problems of one list share a worker pool (:mod:`tuner.study.shared_run`)."""

from __future__ import annotations

import tuner
from tuner_doubles import FakePool

SHAPES = ("2,4,1024,64", "2,4,512,64", "1,4,1024,64")


class RetargetedPool(FakePool):
    """A FakePool that takes the next problem of a list, as ``WorkerPool.retarget`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list = []

    def retarget(self, problem, replay=None) -> bool:
        self.problems.append(problem)
        return True


def test_one_pool_serves_every_problem_of_a_list_and_is_closed_at_its_end(toy, db, pools):
    pools.queued = [RetargetedPool()]
    problems = [toy.parse_problem(shape, "fp16") for shape in SHAPES]
    done = tuner.tune_many(toy, problems, db=db, trials=4, retime=0, seed=0)
    assert [d.result.status for d in done] == ["finished"] * 3
    assert [d.result.measured for d in done] == [4, 4, 4]
    assert len(pools.used) == 1 and pools.used[0].problems == problems[1:]
    assert pools.used[0].closed


def test_a_pool_that_cannot_be_retargeted_is_closed_and_a_new_one_opened(toy, db, pools):
    problems = [toy.parse_problem(shape, "fp16") for shape in SHAPES[:2]]
    done = tuner.tune_many(toy, problems, db=db, trials=4, retime=0, seed=0)
    assert [d.result.status for d in done] == ["finished"] * 2
    assert len(pools.used) == 2 and all(pool.closed for pool in pools.used)
