"""Python's cyclic garbage collector, kept cheap while a study's loop runs.

At tens of GPUs the coordinator's loop is the service's limit (docs/BENCHMARKS.md, "Scale by
simulation"), and its Python allocates fast: proposals, params, rows, results. The collector
then runs every 700 allocations, and each of its full passes walks every object alive, most of
them made before the loop and alive till its end (Ray's, SQLAlchemy's, the sampler's valid
configs). Inside :func:`quiet`, what exists at the start is frozen (moved out of the collector's
reach, ``gc.freeze``) and collections come less often; both are undone at the end::

    with collector.quiet():
        loop.run()
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# allocations less deallocations between two young collections (Python's default is 700)
YOUNG_THRESHOLD = 20_000
_lock = threading.Lock()
_depth = 0  # loops inside quiet() now (several studies may run in threads of one process)
_before: tuple[int, ...] = ()  # the thresholds to restore when the last leaves


@contextmanager
def quiet(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Within: the objects alive at the first entry frozen, young collections every ``young``
    allocations at least; the collector as it was once the last caller inside has left."""
    global _depth, _before
    with _lock:
        if not _depth:
            _before = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(max(young, _before[0]), *_before[1:])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if not _depth:
                gc.set_threshold(*_before)
                gc.unfreeze()
