"""A study's measured results stored by a process of its own, beside the coordinator::

    writer = ResultWriter(engine_url, study_id, owner="host:pid")    # spawns the process
    writer.put(seq, [(number, params, outcome), ...])    # returns at once
    for seq, stored in writer.done(): ...                # each a TrialRecord (or None) or ClaimRefused("lost")
    for seq, stored in writer.drain(): ...               # waits for every put
    writer.close()                                       # its CPU seconds and database time

Why. Feeding 64 simulated GPUs of 30 ms trials, the coordinator's one process was the limit, and
half of its time went to the database client (``Repository.record_trials`` and
``claim_trials``). A thread did not help: the client's Python holds the interpreter lock and
the stores' waits were few. Without any store, the same loop kept the GPUs 87-93% busy against
53-65% (docs/BENCHMARKS.md, twenty-first session). Here each batch of results goes to a
process with its own connection (``Repository.record_trials``, as the coordinator would call
it); the coordinator tells the sampler at once and takes the stored records in later.

What holds: the writer stores the batches in the order put, each in one transaction, with the
owner's lease check (a lost lease comes back as ClaimRefused("lost"), nothing stored for it). It
ignores Ctrl-C: the coordinator drains it before it stops, so a result measured is stored. A
coordinator killed outright closes the writer's queue: it stores what reached it and ends.
A database error comes back as one line and is raised by :meth:`done` or :meth:`drain` as
StorageError; so is the writer's death.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import signal
import time
from typing import Any, Iterator, Sequence

from storage import ClaimRefused, StorageError

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 60.0  # a writer that has not answered its first batch by then is taken for dead
_POLL_S = 0.5  # how often drain checks that the writer still lives


def _serve(url: str, study_id: int, owner: str | None, records: bool, requests: Any, answers: Any) -> None:
    """The writer process: store each batch put, answer (seq, stored) or (seq, error line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator drains us, then closes
    from storage.engine import make_engine
    from storage.repository import Repository

    repository = Repository(make_engine(url))
    parent = multiprocessing.parent_process()
    spent = 0.0
    try:
        while True:
            try:  # the coordinator killed outright never says None: what reached us is stored
                request = requests.get(timeout=_POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    break
                continue
            if request is None:
                break
            seq, items = request
            began = time.perf_counter()
            try:
                stored = repository.record_trials(study_id, items, owner=owner)
            except Exception as error:  # noqa: BLE001 - told to the coordinator, as one line
                answers.put((seq, f"{type(error).__name__}: {error}".splitlines()[0][:500]))
                continue
            finally:
                spent += time.perf_counter() - began
            # a ClaimRefused does not pickle (its ``why`` is not in its args): sent as a triple
            answers.put((seq, [("refused", r.why, str(r)) if isinstance(r, ClaimRefused) else r if records else None
                               for r in stored]))
    finally:
        repository.close()
        answers.put(("closed", time.process_time(), spent))


class ResultWriter:
    def __init__(self, url: str, study_id: int, *, owner: str | None, records: bool = True) -> None:
        """``url``: the database's, password included (SQLAlchemy's ``render_as_string(False)``);
        ``records``: answer each stored trial's TrialRecord (False: None in its place, sparing
        both processes the copy of every row)."""
        context = multiprocessing.get_context("spawn")  # not fork: Ray's threads run here
        self._requests, self._answers = context.Queue(), context.Queue()
        self._process = context.Process(target=_serve, name="tuner-result-writer", daemon=True,
                                        args=(url, study_id, owner, records, self._requests, self._answers))
        self._process.start()
        self._pending: set[int] = set()
        self.cpu_s = 0.0  # the writer process's CPU seconds (known once closed)
        self.store_s = 0.0  # its seconds in record_trials
        self.batches = 0

    @property
    def pending(self) -> int:
        """Batches put and not yet answered."""
        return len(self._pending)

    def put(self, seq: int, items: Sequence[tuple[int, Any, Any]]) -> None:
        """Store ``items`` (number, params, outcome), answered under ``seq``."""
        self._pending.add(seq)
        self.batches += 1
        self._requests.put((seq, list(items)))

    def done(self) -> list[tuple[int, list[Any]]]:
        """The batches stored since the last call, without waiting."""
        out = []
        while self._pending:
            try:
                answer = self._answers.get_nowait()
            except queue.Empty:
                break
            out.append(self._answer(answer))
        return out

    def drain(self) -> Iterator[tuple[int, list[Any]]]:
        """Every batch still pending, as it is stored; StorageError where the writer died."""
        waited = 0.0
        while self._pending:
            try:
                answer = self._answers.get(timeout=_POLL_S)
            except queue.Empty:
                waited += _POLL_S
                if not self._process.is_alive():
                    self._pending.clear()
                    raise StorageError(f"the results writer ended (exit code {self._process.exitcode}); "
                                       "the trials it had not stored are measured again by the next run")
                if waited >= _START_TIMEOUT_S and self.batches == len(self._pending):
                    raise StorageError(f"the results writer stored nothing in {_START_TIMEOUT_S:.0f} s")
                continue
            waited = 0.0
            yield self._answer(answer)

    def _answer(self, answer: tuple[Any, Any]) -> tuple[int, list[Any]]:
        seq, stored = answer
        self._pending.discard(seq)
        if isinstance(stored, str):
            raise StorageError(f"storing results failed: {stored}")
        return seq, [ClaimRefused(r[1], r[2]) if isinstance(r, tuple) else r for r in stored]

    def close(self, timeout: float = 30.0) -> None:
        """End the writer once it has stored what was put (call :meth:`drain` first to see it)."""
        if self._process.pid is None:
            return
        try:
            self._requests.put(None)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    answer = self._answers.get(timeout=max(0.05, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if answer[0] == "closed":
                    self.cpu_s, self.store_s = answer[1], answer[2]
                    break
        finally:
            self._process.join(timeout=5.0)
            if self._process.is_alive():
                logger.warning("the results writer did not end: stopped")
                self._process.terminate()
                self._process.join(timeout=5.0)
            self._requests.close()
            self._answers.close()
