"""What each fault costs, through the real pool and Ray actors (test doubles stand in for the GPU):
a crash, a dead process and a hang each replace the worker, and the pool says for which ticket
and how long the new one took to be ready; faults that need no new worker replace none."""

from __future__ import annotations

import time

import pytest

import worker_family
from templates.family import Problem
from worker_doubles import SlowStartBench
from workers import WorkerPool

PROBLEM = Problem((1024,), "fp32")
FAMILY = worker_family.FAMILY
LAUNCH = FAMILY.launch({"variant": "ok", "tag": 0}, PROBLEM)


def _submit(pool, ticket, behaviour="ok"):
    source = FAMILY.render({"variant": "ok", "tag": ticket}, PROBLEM)
    pool.submit(ticket, {"behaviour": behaviour, "tag": ticket}, source, LAUNCH, ())


def _drain(pool, deadline_s=60.0):
    results, end = {}, time.monotonic() + deadline_s
    while pool.pending() and time.monotonic() < end:
        results.update(pool.poll(timeout=0.5))
    assert not pool.pending()
    return results


@pytest.fixture
def pool(ray_session, tmp_path):
    with WorkerPool(worker_family.NAME, PROBLEM, worker_cls=SlowStartBench, backend="nvrtc",
                    cache_dir=tmp_path / "cache", measure_timeout_s=2.0) as made:
        yield made


def test_each_replacement_is_kept_against_the_ticket_that_caused_it(pool):
    for ticket, behaviour in enumerate(["ok", "crash", "ok", "exit", "ok", "hang", "ok", "raise", "ok"]):
        _submit(pool, ticket, behaviour)
    results = _drain(pool)
    assert [results[t].failure for t in range(9)] == [None, "crash", None, "worker", None, "timeout",
                                                     None, "worker", None]
    # the last trials may finish on another worker while a replacement still starts (a slow machine)
    deadline = time.monotonic() + 60
    while not all(r.ready for r in pool.replacements()) and time.monotonic() < deadline:
        pool.poll(timeout=0.5)
    done = pool.replacements()
    assert sorted(r.ticket for r in done) == [1, 3, 5]  # "raise" fails the trial, keeps the worker
    assert all(r.ready for r in done)
    start = SlowStartBench.START_S
    assert all(start <= r.seconds < start + 20 for r in done), done
    why = {r.ticket: r.why for r in done}
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in why[1] and "died" in why[3] and "ran past 2 s" in why[5]


def test_a_replacement_still_starting_counts_its_time_so_far(pool):
    _submit(pool, 0, "crash")
    assert _drain(pool)[0].failure == "crash"
    starting = pool.replacements()
    assert len(starting) == 1 and starting[0].ticket == 0
    if not starting[0].ready:  # it was polled before the new actor answered
        assert 0 <= starting[0].seconds < SlowStartBench.START_S + 20
    _submit(pool, 1)
    assert _drain(pool)[1].ok
    (done,) = pool.replacements()
    assert done.ready and done.ticket == 0 and done.seconds >= SlowStartBench.START_S
