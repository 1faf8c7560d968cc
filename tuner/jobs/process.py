"""The scheduler of ``tuner serve --run-jobs`` in a process of its own, beside the server's::

    jobs = SchedulerProcess("sqlite:///tuner.db", SchedulerOptions(replay=("landscapes/",)), "attention")
    jobs.start()        # Ray and the scheduler up in the child
    ...                 # the server answers meanwhile
    jobs.close()        # the slices running finish, then the child ends

Its coordinators then never hold the server's interpreter: while two jobs ran in the server's
process, a ``/best`` answer waited up to 309 ms at p99 (docs/BENCHMARKS.md, "Serving"). It runs
at a lower priority (``NICE``), and so does the Ray it starts, so that where the cores are few the
answers come first and the jobs take what is left. The child ignores Ctrl-C (the server's own shutdown stops it) and stops by itself once its parent
is gone (a server killed with ``kill -9``): its slices running finish, their jobs are given back,
and a server started again takes them up.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from typing import Any, Mapping

from tuner.logs import LOGGERS, log_to_stderr

PARENT_POLL_S = 1.0  # how often the child looks for its stop, and for its parent
NICE = 10  # the child's (and so Ray's, which it starts) scheduling priority below the server's


class SchedulerProcess:
    """``tuner.jobs.scheduler.Scheduler`` on ``url`` with ``options``, run in a child process
    (spawned: a clean interpreter, Ray started there); ``family``: the name of an installed
    family, for Ray's start."""

    def __init__(self, url: str, options: Any, family: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        levels = {name: logging.getLogger(name).getEffectiveLevel() for name in LOGGERS}
        self._process = context.Process(target=run, args=(url, options, family, self._stop, levels, os.getpid()),
                                        name="tuner-jobs")

    def start(self) -> None:
        self._process.start()

    def close(self) -> None:
        """Stop taking jobs; wait for the slices running to finish and the child to end."""
        self._stop.set()
        self._process.join()


def run(url: str, options: Any, family: str, stop: Any, levels: Mapping[str, int], parent: int) -> None:
    """The child: the scheduler until ``stop`` is set or the process ``parent`` is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(NICE)
    log_to_stderr(levels)  # the server's lines, at its levels
    from tuner import api, lookup
    from tuner.jobs.scheduler import Scheduler

    halt = threading.Event()

    def watch() -> None:
        while not halt.is_set():
            if stop.wait(PARENT_POLL_S) or os.getppid() != parent:
                halt.set()

    threading.Thread(target=watch, name="jobs-stop", daemon=True).start()
    first = next(iter(options.replay), None)
    with api.quiet_optuna(), api.ray_for(options.pool.ray_address, first, family=lookup.family(family),
                                         simulate_gpus=options.pool.simulate_gpus):
        Scheduler(url, options).run(halt)
