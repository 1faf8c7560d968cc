"""The coordinator's :class:`tuner.study.loop.Pool` protocol names everything it uses of a pool,
and both the real pool and the tests' doubles have all of it."""

from __future__ import annotations

import inspect
import re

from tuner.study.loop import Pool
from tuner_doubles import FakePool, TwoGpuPool

METHODS = sorted(name for name, value in vars(Pool).items()
                 if inspect.isfunction(value) and not name.startswith("_"))
ATTRIBUTES = sorted(Pool.__annotations__)


def test_the_protocol_lists_methods_and_attributes():
    assert {"submit", "poll", "retime", "serve", "pending", "set_abort_above", "set_incumbent",
            "calibrations", "calibrating", "replacements"} <= set(METHODS)
    assert {"device", "limits", "num_gpus", "gpus", "compile_workers", "max_actor_depth"} <= set(ATTRIBUTES)


def test_the_doubles_have_every_member():
    for pool in (FakePool(), TwoGpuPool()):
        assert [name for name in METHODS + ATTRIBUTES if not hasattr(pool, name)] == []


def test_the_worker_pool_has_every_method_and_property():
    from workers.pool import WorkerPool

    source = inspect.getsource(WorkerPool)
    missing = [name for name in METHODS if not callable(getattr(WorkerPool, name, None))]
    # attributes: a property, a class attribute, or set on the instance in the class's code
    unset = [name for name in ATTRIBUTES
             if not hasattr(WorkerPool, name) and not re.search(rf"self\.{name}\s*[:=]", source)]
    assert missing == [] and unset == []
