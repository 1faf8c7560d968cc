"""A study's results stored by a process of their own (``Repository.record_trials`` there)::

    writer = ResultWriter(url, study_id, owner="host:pid")   # starts ``python -m storage.writer``
    writer.put(7, [(number, params, outcome), ...])          # returns at once
    for batch, stored in writer.done(): ...    # stored so far: a TrialRecord or ClaimRefused("lost") each
    for batch, stored in writer.drain(): ...   # waits for the rest
    writer.close()                             # then writer.cpu_s, writer.store_s

Why. Feeding tens of GPUs of 30 ms trials, the coordinator's one process is its limit, and the
database client was about half of its time. A thread did not help (the client's Python holds the
interpreter lock); without any store the same loop kept 64 simulated GPUs 87-93% busy against
53-65% (docs/BENCHMARKS.md, twenty-first session). So the results go to another process, with a
connection of its own, and the coordinator takes the stored records in later.

How. A child interpreter (not ``multiprocessing``, which would import the caller's main script
again in it) reads pickled requests on its stdin and answers on a copy of its stdout (its own
stdout goes to stderr, so nothing else can mix in). The first request says where to store (the
URL, password included, never on a command line); then each batch is one ``record_trials``
transaction, in the order put, with the owner's lease check: a lost lease comes back as
ClaimRefused("lost") and nothing is stored for it. The child runs in a session of its own and
ignores Ctrl-C (the coordinator waits for it, so a result measured is stored); it ends at the end
of its input, so a coordinator killed outright leaves it what reached it to store. A database error comes back as one line,
raised here as StorageError; so is the child's death.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Sequence

from storage.errors import ClaimRefused, StorageError

logger = logging.getLogger(__name__)

_POLL_S = 0.5  # how often a wait for answers checks that the child still runs
_STARTED_S = 60.0  # a child that answered nothing in this long, with batches put, is taken for dead


class ResultWriter:
    def __init__(self, url: str, study_id: int, *, owner: str | None, records: bool = True) -> None:
        """``url``: the database's, password included (SQLAlchemy's ``render_as_string(False)``);
        ``records``: answer each stored trial's TrialRecord (False: None in its place, sparing
        both processes a copy of every row)."""
        home = str(Path(__file__).resolve().parents[1])  # the folder holding this package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH")) if p)}
        self._child = subprocess.Popen([sys.executable, "-m", "storage.writer"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env, start_new_session=True)
        self._requests: queue.Queue[Any] = queue.Queue()
        self._answers: queue.Queue[Any] = queue.Queue()
        self._requests.put((url, study_id, owner, records))
        self._threads = [threading.Thread(target=self._send, name="result-writer-send", daemon=True),
                         threading.Thread(target=self._receive, name="result-writer-receive", daemon=True)]
        for thread in self._threads:
            thread.start()
        self._pending: set[int] = set()
        self._ended = False
        self.batches = 0
        self.cpu_s = 0.0  # the child's CPU seconds (known once closed)
        self.store_s = 0.0  # its seconds in record_trials

    # -- the coordinator's side ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Batches put and not yet answered."""
        return len(self._pending)

    def put(self, batch: int, items: Sequence[tuple[int, Any, Any]]) -> None:
        """Store ``items`` (number, params, outcome); answered under ``batch``."""
        self._pending.add(batch)
        self.batches += 1
        self._requests.put((batch, list(items)))

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
        """Every batch still pending, as it is stored; StorageError where the child ended first."""
        quiet = 0.0
        while self._pending:
            try:
                answer = self._answers.get(timeout=_POLL_S)
            except queue.Empty:
                quiet += _POLL_S
                if quiet >= _STARTED_S and self.batches == len(self._pending):
                    raise StorageError(f"the results writer stored nothing in {_STARTED_S:.0f} s")
                continue
            quiet = 0.0
            yield self._answer(answer)

    def _answer(self, answer: tuple[Any, Any]) -> tuple[int, list[Any]]:
        batch, stored = answer
        if batch == "ended":
            self._pending.clear()
            raise StorageError(f"the results writer ended (exit code {self._child.poll()}) with results "
                               "not stored; their trials are measured again by the next run")
        self._pending.discard(batch)
        if isinstance(stored, str):
            raise StorageError(f"storing results failed: {stored}")
        return batch, [ClaimRefused(r[1], r[2]) if isinstance(r, tuple) else r for r in stored]

    def close(self, timeout: float = 30.0) -> None:
        """End the child once it has stored what was put (see it with :meth:`drain` first)."""
        if self._ended:
            return
        self._ended = True
        self._requests.put(None)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    answer = self._answers.get(timeout=max(0.05, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if answer[0] in ("closed", "ended"):
                    if answer[0] == "closed":
                        self.cpu_s, self.store_s = answer[1]
                    break
        finally:
            try:
                self._child.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                logger.warning("the results writer did not end: stopped")
                self._child.kill()
                self._child.wait()
            for thread in self._threads:
                thread.join(timeout=1.0)

    def _send(self) -> None:
        """The thread that pickles requests into the child's stdin (a put never waits for it)."""
        stream = self._child.stdin
        assert stream is not None
        try:
            while True:
                request = self._requests.get()
                if request is None:
                    break
                pickle.dump(request, stream, protocol=pickle.HIGHEST_PROTOCOL)
                stream.flush()
        except (BrokenPipeError, OSError):  # the child ended: the receiver says so
            pass
        finally:
            try:
                stream.close()
            except OSError:
                pass

    def _receive(self) -> None:
        """The thread that reads the child's answers; ("ended", code) when its output ends."""
        stream = self._child.stdout
        assert stream is not None
        try:
            while True:
                self._answers.put(pickle.load(stream))
        except (EOFError, OSError, pickle.UnpicklingError):
            self._answers.put(("ended", None))


# -- the child ------------------------------------------------------------------------------------
def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Store each batch read from ``requests``; answer (batch, stored) or (batch, error line),
    and ("closed", (CPU seconds, seconds storing)) at the end of the input."""
    from storage.engine import make_engine
    from storage.repository import Repository

    def answer(value: Any) -> None:
        pickle.dump(value, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()

    url, study_id, owner, records = pickle.load(requests)
    repository = Repository(make_engine(url))
    spent = 0.0
    try:
        while True:
            try:
                request = pickle.load(requests)
            except EOFError:  # the coordinator is gone: what reached us is stored
                break
            if request is None:
                break
            batch, items = request
            began = time.perf_counter()
            try:
                stored = repository.record_trials(study_id, items, owner=owner)
            except Exception as error:  # noqa: BLE001 - told to the coordinator, as one line
                answer((batch, f"{type(error).__name__}: {error}".splitlines()[0][:500]))
                continue
            finally:
                spent += time.perf_counter() - began
            # a ClaimRefused does not pickle (its ``why`` is not among its args): sent as a triple
            answer((batch, [("refused", r.why, str(r)) if isinstance(r, ClaimRefused) else r if records else None
                            for r in stored]))
    finally:
        repository.close()
        answer(("closed", (time.process_time(), spent)))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator waits for us, then closes
    answers = os.fdopen(os.dup(1), "wb")  # ours alone: stdout itself goes to stderr
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
