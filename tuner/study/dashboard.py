"""The study as optuna-dashboard reads it: an Optuna copy in our own database, kept up to date.

    optuna-dashboard sqlite:///tuner.db        # every study, live, unmodified dashboard

Our tables are the record of a trial, and the sampler works on its own study in memory
(:mod:`tuner.study.mirror`). While a study runs, each trial it stores is also added, by a process of
its own, to an Optuna study of the same name in Optuna's tables of the same database
(:mod:`tuner.study.optuna_export` says what a trial becomes: a failure is FAIL, with its kind and
reason). An Optuna RDB write took 23-28 ms a trial (median) on SQLite, against 30-50 ms a trial
for a whole study of microsecond kernels on the GPU machine: written by a thread of the
coordinator, the copy made a 200-trial replay 30% slower (the GIL), so it has a process of its own
(``python -m tuner.study.dashboard``, not multiprocessing: a spawned child re-runs the caller's main
module), fed on its stdin; it ends when its stdin does, so with the coordinator, even a killed one::

    copy = start(url, study_record, repo)   # opens the copy; adds what earlier runs left out
    copy.put(trial_record)                  # after each stored trial, returns at once
    copy.finish()                           # optional: no more trials, returns at once
    copy.close()                            # waits for the queue to drain (bounded)

A copy is marked as ours (:data:`tuner.study.optuna_export.COPY_MARK`); an Optuna study of the same
name without the mark is the sampler's study of a version before our tables were the record
(its failures told as ``inf``) and is replaced. Each coordinator adds the trials it measured; at
its start it adds the stored trials the copy lacks (those of a run killed before it could),
unless another coordinator is measuring the study now. Nothing here can fail a study: a copy
that cannot be written (an Optuna schema older than the installed Optuna's, say) is logged once
and left. ``TUNER_OPTUNA_COPY=0`` turns the copy off.

The copy writes what has come in since its last write in one transaction (:func:`_write_batch`,
Optuna's own ORM models, as ``RDBStorage`` writes a trial): Optuna's ``add_trial`` took 17-26 ms
a trial of 16 parameters on this repository's 2-core machine (2026-11-28), most of it a query or
two a parameter, so a copy trial by trial fell behind any study faster than 40-60 trials a second
and took that CPU from the coordinator; a batch took 5.3 ms for one trial, 2.8 ms a trial for 8,
1.6 ms for 32. Where Optuna's models are not as
expected, the copy writes trial by trial (``add_trial``).

On SQLite, while the study runs, the copy leaves the database free at least half the time:
after each trial it writes, it waits as long as the write took. One writer holds a SQLite file
at a time, and a waiting writer polls for it at growing intervals (up to 100 ms). A copy that was
behind wrote trial after trial, 25 ms each, and the coordinator's claims and stores waited up to
0.6 s for a gap. In a simulated two-GPU study on the 2-core CPU machine, the copy made the
study 17-21% slower, and its writes took 2.6-2.9 times as long. Paced, the longest wait fell to
0.04-0.08 s. The study was no faster there: the copy's own CPU competes on 2 cores. Once the
coordinator closes the copy (or is gone: a pipe of its own ends), what is left is written without
waits.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

import optuna

from tuner.errors import first_line
from tuner.study import search
from tuner.study.optuna_export import COPY_MARK, describe, optuna_trial, space_distributions, study_attrs

logger = logging.getLogger("tuner")

CLOSE_TIMEOUT_S = 60.0  # how long the end of a run waits for the copy to catch up
WRITE_ATTEMPTS = 5  # an RDB write that fails (a lock met) is tried again
MISSING_BATCH = 500  # the trials a copy lacked at its start, written this many a transaction


def enabled() -> bool:
    return os.environ.get("TUNER_OPTUNA_COPY", "1").strip().lower() not in ("0", "false", "no", "off")


class DashboardCopy:
    """A study's Optuna copy, written by a process of its own (``python -m tuner.study.dashboard``, fed
    pickled records on its stdin by a thread here): :meth:`put` each stored trial, then
    :meth:`close`. ``missing``: stored trials to add first where the copy lacks them."""

    def __init__(self, url: str, study: Any, missing: Sequence[Any] = ()) -> None:
        self.url, self.study = url, study
        self.written = 0  # trials added to the copy, known once closed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # our modules
        # on SQLite (one writer at a time), a pipe open while the study runs: the copy paces its writes
        running, self._running = os.pipe() if url.startswith("sqlite") else (-1, -1)
        passed = (running,) if running >= 0 else ()
        try:
            self._process = subprocess.Popen([sys.executable, "-m", "tuner.study.dashboard", *map(str, passed)],
                                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             pass_fds=passed)
        except BaseException:
            self._end_pacing()
            raise
        finally:
            for fd in passed:
                os.close(fd)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._finished = False
        self._queue.put((url, study, list(missing)))
        self._feeder = threading.Thread(target=self._feed, name="optuna-copy-feeder", daemon=True)
        self._feeder.start()

    def put(self, trial: Any) -> None:
        """Add a stored trial (``storage.TrialRecord``) to the copy, soon; never waits."""
        self._queue.put(trial)

    def finish(self) -> None:
        """No more trials: the copy writes those put so far (paced) and ends, without waiting
        for it; :meth:`close` waits."""
        if not self._finished:
            self._finished = True
            self._queue.put(None)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Wait (up to ``timeout`` s) for the trials put so far to be written, without pauses:
        the study no longer writes."""
        self._end_pacing()
        self.finish()
        self._feeder.join(timeout)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("the optuna-dashboard copy of %s is behind; the next run of the study "
                           "adds what it lacks", self.study.name)
            self._process.kill()
            self._process.wait()
        assert self._process.stdout is not None
        out = self._process.stdout.read().split()  # the process's last word: trials added
        self._process.stdout.close()
        self.written = int(out[-1]) if out and out[-1].isdigit() else 0

    def _end_pacing(self) -> None:
        """Close this end of the pipe that says the study runs (once): the copy stops pacing."""
        if self._running >= 0:
            os.close(self._running)
            self._running = -1

    def _feed(self) -> None:
        """Pickle what is put to the process's stdin, in order; None closes it."""
        pipe = self._process.stdin
        assert pipe is not None
        try:
            pickle.dump(self._queue.get(), pipe)  # (url, study, missing), alone
            while (item := self._queue.get()) is not None:
                batch = [item]  # and whatever else waits: one write for all of them
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        break
                    batch.append(item)
                pickle.dump(batch, pipe)
                pipe.flush()
                if item is None:
                    break
        except OSError:  # the process is gone (it said why on stderr)
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass


# -- the copy's process ------------------------------------------------------------------------------
def serve(stream: Any, running: int | None = None) -> int:
    """Read (url, study record, missing trials) then trials from ``stream`` (pickled) and add
    them to the copy, until None or the end of the stream (the coordinator is gone); the number
    of trials added. While the pipe end ``running`` has nothing to read (its writer, the
    coordinator, keeps it open while the study runs), each write is followed by a wait as long.
    Ctrl-C is the coordinator's to handle: it closes the copy."""
    url, record, missing = pickle.load(stream)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage, study, numbers = _open(url, record)
        distributions = space_distributions(record.space)
    except Exception as error:  # noqa: BLE001 - the copy never fails the study
        logger.warning("optuna-dashboard copy of %s not written: %s", record.name, first_line(error))
        return 0
    written = 0

    def write(trials: Sequence[Any]) -> int:
        began = time.monotonic()
        added = _write(storage, study, trials, distributions)
        if running is not None and not select.select([running], [], [], 0)[0]:
            time.sleep(time.monotonic() - began)  # the database free for the study's own writes
        return added

    try:
        missing = [trial for trial in missing if trial.number not in numbers]
        for at in range(0, len(missing), MISSING_BATCH):
            written += write(missing[at:at + MISSING_BATCH])
        while True:
            try:
                batch = pickle.load(stream)
            except EOFError:
                break
            if batch is None:
                break
            written += write(batch)
    finally:
        storage.engine.dispose()  # its connections closed now: SQLite folds its -wal file back
    return written


def _write(storage: Any, study: optuna.Study, trials: Sequence[Any], distributions: dict[str, Any]) -> int:
    """Add stored trials to the copy, in one transaction where Optuna's models allow; the number
    added."""
    frozen = []
    for trial in trials:
        try:
            frozen.append(optuna_trial(trial, distributions))
        except ValueError as error:
            logger.debug("optuna-dashboard copy: %s", error)
    for attempt in range(WRITE_ATTEMPTS):
        try:
            return _write_batch(storage, study, frozen)
        except _NoBatch:
            break
        except Exception as error:  # noqa: BLE001 - a lock met; the last one is logged
            if attempt == WRITE_ATTEMPTS - 1:
                logger.warning("optuna-dashboard copy: %d trials not written: %s", len(frozen), first_line(error))
                return 0
            time.sleep(0.05 * 2 ** attempt)
    return sum(_write_one(study, trial) for trial in frozen)


class _NoBatch(Exception):
    """Optuna's models are not those the batch writes (another Optuna version)."""


def _write_batch(storage: Any, study: optuna.Study, trials: Sequence[optuna.trial.FrozenTrial]) -> int:
    """Trials added to ``study`` in one transaction, as ``RDBStorage`` adds one (a row a trial,
    its parameters, value and attributes; numbers following the study's last), without its
    queries a parameter: the copy's distributions are one study's, checked once."""
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        value_of = models.TrialValueModel.value_to_stored_repr
    except (ImportError, AttributeError) as error:
        raise _NoBatch(str(error)) from None
    if not trials:
        return 0
    study_id = study._study_id
    with _create_scoped_session(storage.scoped_session, True) as session:
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        number = session.query(models.TrialModel).filter(models.TrialModel.study_id == study_id).count()
        for trial in trials:
            row = models.TrialModel(study_id=study_id, number=number, state=trial.state,
                                    datetime_start=trial.datetime_start,
                                    datetime_complete=trial.datetime_complete)
            row.params = [models.TrialParamModel(
                param_name=name, param_value=trial.distributions[name].to_internal_repr(value),
                distribution_json=optuna.distributions.distribution_to_json(trial.distributions[name]))
                for name, value in trial.params.items()]
            if trial.value is not None:
                stored, kind = value_of(trial.value)
                row.values = [models.TrialValueModel(objective=0, value=stored, value_type=kind)]
            row.user_attributes = [models.TrialUserAttributeModel(key=key, value_json=json.dumps(value))
                                   for key, value in trial.user_attrs.items()]
            session.add(row)
            number += 1
    return len(trials)


def _write_one(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> int:
    """Add one trial through Optuna's public ``add_trial``: 1, or 0 where it could not be."""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            study.add_trial(trial)
            return 1
        except Exception as error:  # noqa: BLE001 - a lock met; the last one is logged
            if attempt == WRITE_ATTEMPTS - 1:
                logger.warning("optuna-dashboard copy: trial %d not written: %s", trial.user_attrs.get("number"),
                               first_line(error))
            time.sleep(0.05 * 2 ** attempt)
    return 0


def start(url: str, study: Any, repository: Any) -> DashboardCopy | None:
    """The copy of ``study`` (a ``storage.StudyRecord``) at ``url``, its process started; None
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


if __name__ == "__main__":  # the copy's process (DashboardCopy)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S", level=logging.WARNING)
    written = serve(sys.stdin.buffer, int(sys.argv[1]) if len(sys.argv) > 1 else None)
    try:
        print(written, flush=True)
    except BrokenPipeError:  # the coordinator was killed and no longer reads the count
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
