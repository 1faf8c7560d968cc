"""One pool of worker processes for the test session, a process a core, for work that is pure
computation or a compiler's (whole products checked config by config, kernels compiled): on the
2-core CI machine two parts of it run at once instead of one after the other.

The processes are spawned (as ``workers.compile.compile_all``'s are), so nothing of the test
process (Ray's threads, a CUDA context) is copied into them; they start on first use and stop
at the session's end (``tests/conftest.py``).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

_pool: ProcessPoolExecutor | None = None


def count() -> int:
    """How many processes the pool has: one a core."""
    return os.cpu_count() or 1


def pool() -> ProcessPoolExecutor:
    """The session's pool, started on first use."""
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(count(), mp_context=multiprocessing.get_context("spawn"))
    return _pool


def shutdown() -> None:
    """Stop the pool's processes, where it was started."""
    global _pool
    if _pool is not None:
        _pool.shutdown(cancel_futures=True)
        _pool = None


def compile_each(requests: list, cache_dir) -> list:
    """``workers.compile.compile_cubin`` of each request (into ``cache_dir``) on the pool, the
    binaries in the requests' order; a failed compile raises its ``CompileError`` here."""
    from workers.compile import compile_cubin

    futures = [pool().submit(compile_cubin, request, cache_dir=cache_dir) for request in requests]
    return [future.result() for future in futures]
