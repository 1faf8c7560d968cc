"""Ray's processes end with the process that started them, even one killed with ``kill -9``.

A local Ray started by ``ray.init`` is a tree of processes under the driver: the GCS, the
raylet, the dashboard, the log monitor, and under the raylet its agents and workers. Ray ties
the first ones to the driver (they die with it), but not the raylet's agents: after ``kill -9``
of a coordinator its ``DashboardAgent`` and ``RuntimeEnvAgent`` lived on for about a minute.
The watchdog is a small process, in a session of its own (a Ctrl-C to the terminal does not
reach it), that records the driver's new descendants every ``INTERVAL_S`` while Ray is up; once
the driver is gone without saying stop, it kills those still running (a pid is matched with its
start time, so a pid the system gave to another process since is never hit)::

    watchdog = Watchdog.start()      # right before ray.init
    ...
    watchdog.stop()                  # after ray.shutdown: it ends, killing nothing

Linux only (it reads ``/proc``); elsewhere :meth:`Watchdog.start` returns None.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

logger = logging.getLogger("tuner")

INTERVAL_S = 0.5
PROC = Path("/proc")


def process_table() -> dict[int, tuple[int, int]]:
    """Every process: pid -> (parent pid, start time in clock ticks since boot)."""
    table: dict[int, tuple[int, int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
        table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """The processes under ``root`` (children, theirs, ...): pid -> start time."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, ()))
    return found


def kill_recorded(recorded: dict[int, int]) -> list[int]:
    """SIGKILL each recorded process still running (same pid, same start time) and anything
    now under it; the pids killed."""
    table = process_table()
    doomed: dict[int, int] = {}
    for pid, started in recorded.items():
        if table.get(pid, (0, -1))[1] == started:
            doomed[pid] = started
            doomed.update(descendants(pid, table))
    killed = []
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


class Watchdog:
    """The parent's end of a running watchdog (:meth:`start`)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @classmethod
    def start(cls) -> Watchdog | None:
        """A watchdog of this process; None where there is no ``/proc`` or it cannot start."""
        if not (PROC / str(os.getpid()) / "stat").exists():
            return None
        before = descendants(os.getpid())  # what this process runs already is not Ray's
        try:
            process = subprocess.Popen(
                [sys.executable, __file__, str(os.getpid())], stdin=subprocess.PIPE,  # stdlib only
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            assert process.stdin is not None
            process.stdin.write(" ".join(f"{pid}:{started}" for pid, started in before.items()).encode() + b"\n")
            process.stdin.flush()
        except OSError as error:
            logger.debug("no watchdog for Ray's processes: %s", error)
            return None
        return cls(process)

    def stop(self) -> None:
        """Ray was shut down here: the watchdog ends and kills nothing."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(b"stop\n")
            self.process.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def watch(parent: int) -> int:
    """The watchdog's own loop: record ``parent``'s descendants (but those its first line of
    input names, ``pid:start`` each: what the parent ran before Ray) until it says stop (exit 0,
    nothing killed) or is gone (kill what it left running)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    me = os.getpid()
    before = {tuple(map(int, item.split(b":"))) for item in sys.stdin.buffer.readline().split()}
    recorded: dict[int, int] = {}
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            break
        if os.getppid() != parent:
            break
        for pid, started in descendants(parent).items():
            if pid != me and (pid, started) not in before:
                recorded[pid] = started
        ready, _, _ = select.select([sys.stdin.buffer], [], [], INTERVAL_S)
        if ready:
            if sys.stdin.buffer.readline().strip() == b"stop":
                return 0
            break  # end of file without a word: the parent is gone
    time.sleep(0.2)  # what Ray ends by itself on the driver's death goes first
    kill_recorded(recorded)
    return 0


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1])))
