"""What the studies of one list of problems share (:func:`tuner.study.many.tune_list`)::

    with SharedRun() as shared:
        for fam, problem in problems:
            with shared.pool(fam, problem, where, open_pool) as pool:
                copy = shared.start_copy(start)   # the study's optuna-dashboard copy
                ...                               # the study
                shared.defer(copy)                # written on while the next study sets up

One worker pool serves the problems in turn while they are of one family and measured where the
same options say: retargeted to each next problem (``WorkerPool.retarget``), its Ray actors and
node agents are not started again. A new pool took 2 s a problem on the 2-core CPU machine
(replayed); a GPU worker also creates its CUDA context, loads the family and compiles its check
kernels, and is now only told the next problem (it uploads that problem's inputs). A pool that
cannot be retargeted (another family, simulated GPUs, a test's double), or whose study raised, is
closed and a new one opened.

A study's optuna-dashboard copy (:mod:`tuner.study.dashboard`) is handed over at the study's
end: its process writes what is left (paced, as while the study ran) while the next study sets
up (its pool, warm start, valid configs), and the run waits for it before the next copy starts,
or at its end.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

from templates.family import KernelFamily, Problem
from workers.pool_options import PoolOptions


class SharedRun:
    """A worker pool kept from one problem's study to the next, and the optuna-dashboard copy
    of the study before, still writing; :meth:`close` ends both."""

    def __init__(self) -> None:
        self.opened = 0  # pools opened so far
        self._pool: Any = None
        self._held: Any = None  # the context manager that opened it
        self._key: tuple[Any, ...] | None = None
        self._copy: Any = None

    @contextmanager
    def pool(self, fam: KernelFamily, problem: Problem, where: PoolOptions,
             open_pool: Callable[[KernelFamily, Problem, PoolOptions], Any]) -> Iterator[Any]:
        """The pool for ``problem``: the one kept, retargeted to it, where it can be; else a new
        one from ``open_pool`` (a context manager giving a pool), kept for the next. A study
        that raises closes it."""
        key = (fam.name, fam.template_hash, replace(where, replay=None))
        kept = self._pool
        if kept is not None and (key != self._key or not _retargeted(kept, problem, where)):
            self._close_pool()
        if self._pool is None:
            held = open_pool(fam, problem, where)
            self._pool, self._held, self._key = held.__enter__(), held, key
            self.opened += 1
        try:
            yield self._pool
        except BaseException:
            self._close_pool(*sys.exc_info())
            raise

    def start_copy(self, start: Callable[[], Any]) -> Any:
        """A study's optuna-dashboard copy, from ``start``, once the copy of the study before is
        written (waited for): two copies never write at once (each creating Optuna's tables in
        a new database, the second failed)."""
        self._wait_copy()
        return start()

    def defer(self, copy: Any) -> None:
        """Take a study's optuna-dashboard copy (``DashboardCopy``) at the study's end: it
        writes what it has while the next study sets up."""
        copy.finish()
        self._wait_copy()  # one held at a time (a copy started without start_copy)
        self._copy = copy

    def close(self) -> None:
        """The pool closed, the last copy written (waited for)."""
        try:
            self._close_pool()
        finally:
            self._wait_copy()

    def _close_pool(self, *exc: Any) -> None:
        held, self._pool, self._held, self._key = self._held, None, None, None
        if held is not None:
            held.__exit__(*(exc or (None, None, None)))

    def _wait_copy(self) -> None:
        copy, self._copy = self._copy, None
        if copy is not None:
            copy.close()

    def __enter__(self) -> "SharedRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _retargeted(pool: Any, problem: Problem, where: PoolOptions) -> bool:
    """Whether ``pool`` took ``problem`` (a pool without ``retarget``, a test's double: no)."""
    retarget = getattr(pool, "retarget", None)
    try:
        return bool(retarget(problem, where.replay)) if retarget is not None else False
    except Exception:  # noqa: BLE001 - a new pool says what is wrong, as it would have
        return False
