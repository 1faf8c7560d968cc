"""The watchdog of a local Ray (workers/watchdog.py): what a process started after the watchdog
ends within a second of that process being killed; a clean stop kills nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.watchdog import process_table

ROOT = Path(__file__).resolve().parents[2]
PARENT = """
import subprocess, sys, time
from workers.watchdog import Watchdog
early = subprocess.Popen(["sleep", "300"])            # before the watchdog: not its business
watchdog = Watchdog.start()
late = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])  # a child with a child of its own
print(early.pid, late.pid, watchdog.process.pid, flush=True)
if sys.argv[1] == "stop":
    watchdog.stop()
    print("stopped", flush=True)
time.sleep(300)
"""

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")


def _alive(pid: int, table: dict[int, tuple[int, int]]) -> bool:
    return pid in table and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def _family(pid: int) -> list[int]:
    table = process_table()
    return [p for p, (parent, _) in table.items() if parent == pid]


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_what_a_killed_process_started_ends_with_it(how):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.stdout is not None
    early, late, watchdog = map(int, parent.stdout.readline().split())
    grandchild = None
    deadline = time.monotonic() + 5
    while grandchild is None and time.monotonic() < deadline:
        grandchild = next(iter(_family(late)), None)
        time.sleep(0.05)
    if how == "stop":
        assert parent.stdout.readline().strip() == "stopped"
    time.sleep(0.6)  # a poll of the watchdog's
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(1.5)
    table = process_table()
    try:
        assert not _alive(watchdog, table)
        assert _alive(early, table)  # started before the watchdog: left alone
        if how == "kill":
            assert not _alive(late, table) and grandchild is not None and not _alive(grandchild, table)
        else:  # stopped cleanly: it killed nothing
            assert _alive(late, table)
    finally:
        for pid in (early, late, grandchild):
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
