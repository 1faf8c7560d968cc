"""The study as optuna-dashboard reads it: an Optuna copy in our own database, kept up to date.

    optuna-dashboard sqlite:///tuner.db        # every study, live, unmodified dashboard

Our tables are the record of a trial, and the sampler works on its own study in memory
(:mod:`tuner.mirror`). While a study runs, each trial it stores is also added, by a thread of
its own, to an Optuna study of the same name in Optuna's tables of the same database
(:mod:`tuner.optuna_export` says what a trial becomes: a failure is FAIL, with its kind and
reason). An Optuna RDB write took 23 ms a trial (median) on SQLite, against 30-50 ms a trial for a
whole study of microsecond kernels on the GPU machine, so the loop does not wait for it: the thread
writes while the coordinator waits on the pool (it shares the interpreter, so a study bound by the
coordinator's own work still pays the CPU)::

    copy = start(url, study_record, repo)   # opens the copy; adds what earlier runs left out
    copy.put(trial_record)                  # after each stored trial, returns at once
    copy.close()                            # waits for the queue to drain (bounded)

A copy is marked as ours (:data:`tuner.optuna_export.COPY_MARK`); an Optuna study of the same
name without the mark is the sampler's study of a version before our tables were the record
(its failures told as ``inf``) and is replaced. Each coordinator adds the trials it measured; at
its start it adds the stored trials the copy lacks (those of a run killed before it could),
unless another coordinator is measuring the study now. Nothing here can fail a study: a copy
that cannot be written (an Optuna schema older than the installed Optuna's, say) is logged once
and left. ``TUNER_OPTUNA_COPY=0`` turns the copy off.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Sequence

import optuna

from tuner import search
from tuner.errors import one_line
from tuner.optuna_export import COPY_MARK, describe, optuna_trial, space_distributions, study_attrs

logger = logging.getLogger("tuner")

CLOSE_TIMEOUT_S = 60.0  # how long the end of a run waits for the copy to catch up
WRITE_ATTEMPTS = 5  # an RDB write that meets SQLite's lock held by our writer is tried again
_STOP = object()


def enabled() -> bool:
    return os.environ.get("TUNER_OPTUNA_COPY", "1").strip().lower() not in ("0", "false", "no", "off")


class DashboardCopy:
    """A study's Optuna copy, written by a thread: :meth:`put` each stored trial, then
    :meth:`close`. ``missing``: stored trials to add first where the copy lacks them."""

    def __init__(self, url: str, study: Any, missing: Sequence[Any] = ()) -> None:
        self.url, self.study = url, study
        self._missing = list(missing)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.written = 0  # trials added to the copy (tests, logs)
        self._thread = threading.Thread(target=self._run, name="optuna-copy", daemon=True)
        self._thread.start()

    def put(self, trial: Any) -> None:
        """Add a stored trial (``storage.TrialRecord``) to the copy, soon."""
        self._queue.put(trial)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Wait (up to ``timeout`` s) for the trials put so far to be written."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("the optuna-dashboard copy of %s is behind; the next run of the study "
                           "adds what it lacks", self.study.name)

    # -- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            storage, study, numbers = _open(self.url, self.study)
            distributions = space_distributions(self.study.space)
        except Exception as error:  # noqa: BLE001 - the copy never fails the study
            logger.warning("optuna-dashboard copy of %s not written: %s", self.study.name, one_line(error))
            return self._drain()
        try:
            for trial in self._missing:
                if trial.number not in numbers:
                    self._write(study, trial, distributions)
            while (trial := self._queue.get()) is not _STOP:
                self._write(study, trial, distributions)
        finally:
            storage.engine.dispose()  # its connections closed now, not when collected

    def _write(self, study: optuna.Study, trial: Any, distributions: dict[str, Any]) -> None:
        try:
            frozen = optuna_trial(trial, distributions)
        except ValueError as error:
            logger.debug("optuna-dashboard copy: %s", error)
            return
        for attempt in range(WRITE_ATTEMPTS):
            try:
                study.add_trial(frozen)
                self.written += 1
                return
            except Exception as error:  # noqa: BLE001 - a lock met; the last one is logged
                if attempt == WRITE_ATTEMPTS - 1:
                    logger.warning("optuna-dashboard copy: trial %d not written: %s", trial.number,
                                   one_line(error))
                time.sleep(0.05 * 2 ** attempt)

    def _drain(self) -> None:
        while self._queue.get() is not _STOP:
            pass


def start(url: str, study: Any, repository: Any) -> DashboardCopy | None:
    """The copy of ``study`` (a ``storage.StudyRecord``) at ``url``, its thread started; None
    when turned off. The stored trials are added where the copy lacks them, unless another
    coordinator holds a live lease on the study (it adds its own)."""
    if not enabled():
        return None
    others = [r for r in repository.running(study.id) if search.owner_alive(r.owner, r.heartbeat_at or r.started_at)]
    return DashboardCopy(url, study, () if others else repository.trials(study.id))


def _open(url: str, record: Any) -> tuple[Any, optuna.Study, set[int]]:
    """Optuna's storage at ``url`` (its tables created there if absent; ours untouched), the
    study named as ``record`` in it, described, and the stored trial numbers it holds."""
    from storage import use_sqlite_writer

    storage = optuna.storages.RDBStorage(url)
    use_sqlite_writer(storage.engine)  # on SQLite, waits for our writer's lock like ours do
    study = optuna.create_study(study_name=record.name, storage=storage, direction="minimize",
                                load_if_exists=True)
    trials = study.get_trials(deepcopy=False)
    numbers = {t.user_attrs["number"] for t in trials if "number" in t.user_attrs}
    if COPY_MARK not in study.user_attrs and trials and not numbers:  # an old version's sampler study
        logger.info("replacing the Optuna study %s of an earlier version with a copy of our trials",
                    record.name)
        optuna.delete_study(study_name=record.name, storage=storage)
        study = optuna.create_study(study_name=record.name, storage=storage, direction="minimize")
        numbers = set()
    describe(study, study_attrs(record))
    return storage, study, numbers
