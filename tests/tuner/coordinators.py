"""Real ``tuner tune`` processes for the interruption and concurrency tests: started, watched
(every process under each one is recorded, to check that its Ray ends with it), signalled."""

from __future__ import annotations

import json
import re
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import storage
import tuner
from tuner_doubles import LANDSCAPE, ROOT
from workers.watchdog import descendants, process_table

DATA = ROOT / "tests" / "data"
# A second problem with a landscape of its own: a second study on the same database.
OTHER = ("4,8,512,64", DATA / "attention_4x8x512x64-fp16-causal_h200.json")


def tune_argv(db: str, trials: int, *, shape: str = "2,8,1024,64", landscape: Path = LANDSCAPE,
              seed: int = 0) -> list[str]:
    return [sys.executable, "-m", "tuner", "tune", "attention", "--shape", shape, "--dtype", "fp16",
            "--causal", "--replay", str(landscape), "--trials", str(trials), "--db", db,
            "--seed", str(seed), "--retime", "0"]


class Coordinator:
    """One ``tuner tune`` process; the processes under it are recorded while it runs."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("TUNER_DB", None)
        with _ctrl_c_not_ignored():
            self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
        self.started = time.monotonic()
        self.spawned: dict[int, int] = {}  # pid -> start time, of every process seen under it
        self.err_lines: list[str] = []
        self._done = threading.Event()
        self._first_trial = threading.Event()
        self._reader_done = threading.Event()
        threading.Thread(target=self._record, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _record(self) -> None:
        while not self._done.is_set() and self.process.poll() is None:
            self.spawned.update(descendants(self.process.pid))
            time.sleep(0.1)

    def _read_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.err_lines.append(line)
            if "new best" in line or "measured (" in line:
                self._first_trial.set()
        self._reader_done.set()

    def wait_for_line(self, text: str, timeout: float = 60) -> bool:
        """Until a line of stderr holds ``text``; False after ``timeout`` seconds or at exit."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            lines = self.err_lines[seen:]
            if any(text in line for line in lines):
                return True
            seen += len(lines)
            if self.process.poll() is not None and self._reader_done.is_set():
                return False
            time.sleep(0.02)
        return False

    def wait_for_trials(self, timeout: float = 90) -> None:
        """Until the study is under way (its first trial measured)."""
        assert self._first_trial.wait(timeout), "".join(self.err_lines)[-2000:]

    def wait_for_stored(self, db: str, timeout: float = 30) -> None:
        """Until the study has a trial stored (or has ended)."""
        deadline = time.monotonic() + timeout
        while not any(stored_keys(db).values()) and self.process.poll() is None:
            assert time.monotonic() < deadline, "".join(self.err_lines)[-2000:]
            time.sleep(0.02)

    def kill_holding_a_lease(self, db: str, *, others: Sequence["Coordinator"] = (),
                             timeout: float = 30) -> list[tuple[int, str]]:
        """``kill -9`` while the process holds a lease in the database (a config in flight): the
        running trials it left, (number, config as canonical JSON). The process is stopped
        (SIGSTOP) before each look at its leases and killed only if it holds one then, so that it
        cannot settle them between the look and the kill (replayed trials take microseconds).
        ``others`` (coordinators on the same study) are stopped meanwhile, so that none settles
        those leases before they are read, and continued after. SQLite runs in WAL mode: a
        stopped writer does not keep the leases from being read."""
        owner = f"{socket.gethostname()}:{self.process.pid}"
        for other in others:
            other.process.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + timeout
            stopped_at = time.monotonic()
            while time.monotonic() < deadline and self.process.poll() is None:
                self._stop()
                if leases(db, owner):
                    break
                self.process.send_signal(signal.SIGCONT)
                time.sleep(0.005)
                if time.monotonic() - stopped_at > 2.0:
                    # another stopped holding SQLite's write lock (then nobody can claim): let
                    # them run a moment to finish that transaction, and stop them again
                    for other in others:
                        other.process.send_signal(signal.SIGCONT)
                    time.sleep(0.05)
                    for other in others:
                        other.process.send_signal(signal.SIGSTOP)
                    stopped_at = time.monotonic()
            self.process.kill()
            self.process.wait(30)
            return leases(db, owner)
        finally:
            for other in others:
                other.process.send_signal(signal.SIGCONT)

    def _stop(self, timeout: float = 5.0) -> None:
        """SIGSTOP, and wait until the kernel shows the process stopped (state T)."""
        self.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{self.process.pid}/stat").read_text()
            except OSError:
                return
            if stat[stat.rindex(")") + 2] in "Tt":
                return
            time.sleep(0.001)

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        """Exit code, stdout and stderr."""
        assert self.process.stdout is not None
        out = self.process.stdout.read() if self.process.wait(timeout) is not None else ""
        self._done.set()
        self._reader_done.wait(10)  # the stderr reader's last lines
        return self.process.returncode, out, "".join(self.err_lines)

    def leftovers(self, grace: float = 10.0) -> list[str]:
        """The processes it started that still run ``grace`` seconds after it ended."""
        deadline = time.monotonic() + grace
        while True:
            table = process_table()
            alive = [pid for pid, started in self.spawned.items() if table.get(pid, (0, -1))[1] == started]
            if not alive or time.monotonic() > deadline:
                return [_command(pid) for pid in alive]
            time.sleep(0.25)


@contextmanager
def _ctrl_c_not_ignored() -> Iterator[None]:
    """A process started here gets Ctrl-C (SIGINT) as a terminal's command does, even where the
    tests run with it ignored (a shell's background job, ``pytest &``, starts so, and a child
    inherits an ignored signal): while the child is started, this process handles it."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _command(pid: int) -> str:
    try:
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return str(pid)


def stored_keys(db: str) -> dict[str, list[str]]:
    """Each study's stored configs, as canonical JSON."""
    return {s.name: [json.dumps(t.params, sort_keys=True) for t in tuner.show(s.name, db=db).trials]
            for s in tuner.studies(db=db)}


def leases(db: str, owner: str | None = None) -> list[tuple[int, str]]:
    """(number, config as canonical JSON) of the running trials ``owner`` (host:pid) holds, over
    every study; every running trial where ``owner`` is None."""
    repo = storage.open_repository(db)
    try:
        return [(r.number, json.dumps(r.params, sort_keys=True)) for s in repo.studies() for r in repo.running(s.id)
                if owner is None or r.owner == owner]
    finally:
        repo.close()


def assert_settled_once(left: Sequence[tuple[int, str]], err: str, db: str) -> None:
    """Each lease a killed coordinator ``left``, settled by the coordinator that went on (``err``
    its log): no running trial remains, each left config is stored exactly once, and the log's
    "left running" lines name left trials only. (One the sampler proposed again before the
    coordinator read the lease was measured as a new trial, and its lease dropped without that
    line: the leases are read at each sync, the proposals made in between.)"""
    assert leases(db) == []
    assert set(settled(err)) <= {number for number, _ in left}, (settled(err), left)
    (keys,) = stored_keys(db).values()
    assert all(keys.count(key) == 1 for _, key in left), left


def settled(err: str) -> list[int]:
    """The numbers of the running trials a coordinator settled as left by a stopped or killed run."""
    return sorted(int(n) for n in re.findall(r"trial (\d+) was left running by a run that stopped or died", err))
