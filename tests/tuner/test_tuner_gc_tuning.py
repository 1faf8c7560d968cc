"""tuner.study.gc_tuning: the garbage collector made cheap while a loop runs, and put back after."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from tuner.study import gc_tuning


def test_quiet_freezes_what_exists_raises_the_threshold_and_puts_both_back():
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    alive = [{"made": i} for i in range(1000)]  # tracked containers made before the loop
    with gc_tuning.quiet(young=50_000):
        assert gc.get_threshold() == (max(50_000, before[0]), *before[1:])
        assert gc.get_freeze_count() >= frozen + len(alive)
        with gc_tuning.quiet():  # a nested loop changes nothing
            assert gc.get_threshold()[0] == max(50_000, before[0])
        assert gc.get_threshold()[0] == max(50_000, before[0])
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_an_error_inside_still_puts_the_collector_back():
    before = gc.get_threshold()
    with pytest.raises(KeyboardInterrupt):
        with gc_tuning.quiet():
            raise KeyboardInterrupt
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_loops_in_threads_restore_once_the_last_has_left():
    before = gc.get_threshold()
    inside, leave = threading.Barrier(2), threading.Event()

    def loop() -> None:
        with gc_tuning.quiet():
            inside.wait()
            leave.wait()

    worker = threading.Thread(target=loop)
    with gc_tuning.quiet():
        worker.start()
        inside.wait()
    # this caller left first: the worker's loop still runs quiet
    assert gc.get_threshold()[0] == max(gc_tuning.YOUNG_THRESHOLD, before[0])
    leave.set()
    worker.join()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_inside_are_still_collected():
    class Node:
        pass

    with gc_tuning.quiet(young=100):
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()  # young objects are not frozen: the cycle is found
        assert gone() is None
