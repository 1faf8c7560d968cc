"""`tuner serve --run-jobs` itself, on each backend: a real server with its scheduler, real Ray
and replay workers standing in for two GPUs (simulated); clients submit with the commands. Jobs
of different priorities all finish, the higher first, taking the GPUs while it is open; jobs of
equal priority run at once on a GPU each; a job alone gets both; a job cancelled mid-way keeps
every trial stored (PostgreSQL; SQLite in the soak tier); a scheduler killed with kill -9 and
started again goes on where the database left it, measuring no config twice (soak: two servers,
and Ray in each)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tuner.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPES = (ROOT / "templates" / "attention" / "landscapes", ROOT / "tests" / "data")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`tuner serve --run-jobs` on a free loopback port, replaying the landscapes on 2 simulated GPUs."""

    def __init__(self, url: str, cwd: Path, slice_trials: int = 3) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "tuner", "serve", "--db", url, "--port", str(self.port), "--run-jobs",
                   "--slice-trials", str(slice_trials), "--simulate-gpus", "2", "--replay", *map(str, LANDSCAPES)]
        self.log = open(cwd / f"serve-{self.port}.log", "w+")
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 90
        while True:
            try:
                self.get("/jobs")
                return
            except (urllib.error.URLError, ConnectionError):
                assert self.process.poll() is None and time.monotonic() < deadline, self.errors()
                time.sleep(0.3)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=30) as answer:
            return json.loads(answer.read())

    def errors(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=120)
        return self.errors()


@pytest.fixture
def tokens(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    from storage import open_repository

    open_repository(url).close()
    made = {}
    for scope in ("read", "write"):
        capsys.readouterr()
        assert main(["token", "create", "--scope", scope, "--db", url]) == 0
        made[scope] = capsys.readouterr().out.strip()
    return made


@pytest.fixture
def server(url: str, tokens: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    running = Server(url, tmp_path)
    yield running
    err = running.stop()
    assert "Traceback" not in err, err


def _submit(capsys: pytest.CaptureFixture[str], base: str, token: str, *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["submit", "attention", *argv, "--server", base, "--token", token, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _wait(what: Callable[[], Any], timeout: float = 150) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def _trials(server: Server, study: str) -> dict[int, str]:
    """The stored trials of a study: number -> its config."""
    shown = server.get("/studies/" + urllib.request.quote(study, safe=""))
    return {t["number"]: json.dumps(t["params"], sort_keys=True) for t in shown["trials"]}


def _slices(log: str) -> list[tuple[int, int]]:
    """(job id, its GPUs) of each slice the server's log says it started, in order."""
    return [(int(job), int(gpus)) for job, gpus in re.findall(r"job (\d+): .* trials on (\d+) of 2 GPUs", log)]


def _at_once(log: str, jobs: set[int]) -> bool:
    """Whether the log shows a slice of each of ``jobs`` running at the same time: each slice's
    start line ("... trials on G of 2 GPUs") comes before its end line ("... at N of M trials")."""
    running: set[int] = set()
    for line in log.splitlines():
        started = re.search(r"job (\d+): .* trials on \d+ of 2 GPUs", line)
        ended = re.search(r"job (\d+): .* at \d+ of \d+ trials", line)
        if started:
            running.add(int(started.group(1)))
        elif ended:
            running.discard(int(ended.group(1)))
        if jobs <= running:
            return True
    return False


# PostgreSQL by default (the backend several machines share), SQLite in the soak tier, for the
# suite's time: tests/jobs/test_jobs_api.py runs a server on SQLite by default.
@pytest.mark.parametrize("url", [pytest.param("sqlite", marks=pytest.mark.soak), "postgresql"], indirect=True)
def test_jobs_share_the_gpus_by_priority_and_a_cancel_keeps_every_trial(server, tokens, capsys):
    write = tokens["write"]
    low = _submit(capsys, server.base, write, "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                  "--trials", "6")
    equal = _submit(capsys, server.base, write, "--shape", "1,16,2048,64", "--dtype", "fp16", "--causal",
                    "--trials", "6")
    high = _submit(capsys, server.base, write, "--shape", "4,8,512,64", "--dtype", "fp16", "--causal",
                   "--trials", "3", "--priority", "5")
    ids = [low["id"], equal["id"], high["id"]]
    done = _wait(lambda: (jobs := {j["id"]: j for j in server.get("/jobs")}) and
                 all(jobs[i]["state"] not in ("queued", "running") for i in ids) and jobs)
    low, equal, high = (done[i] for i in ids)
    assert [j["state"] for j in (low, equal, high)] == ["done"] * 3, server.errors()
    assert high["finished_at"] < min(low["finished_at"], equal["finished_at"])
    for job in (low, equal, high):
        assert job["measured"] == job["budget"] and job["eta_s"] == 0.0 and job["best_median_ms"] > 0
        assert len(_trials(server, job["problems"][0]["study"])) == job["trials"]
    log = server.errors()
    slices = _slices(log)
    # once the higher priority has a GPU, no slice of a lower one starts until it is done
    held = log[log.index(f"job {high['id']}: "):log.index(f"job {high['id']} done")]
    assert {job for job, _ in _slices(held)} == {high["id"]}
    # the two of equal priority ran at once, a GPU each (a slice of each between its start and its end)
    assert (low["id"], 1) in slices and (equal["id"], 1) in slices
    assert _at_once(log, {low["id"], equal["id"]}), log

    capsys.readouterr()
    assert main(["jobs", "--server", server.base]) == 0
    listing = capsys.readouterr().out
    assert f"{high['id']:>4}  done" in listing and "3/3 trials" in listing

    big = _submit(capsys, server.base, write, "--shape", "4,8,1024,64", "--dtype", "bf16", "--causal",
                  "--trials", "200")
    running = _wait(lambda: (job := server.get(f"/jobs/{big['id']}"))["measured"] >= 3 and job)
    assert running["state"] == "running" and 0 < running["eta_s"]
    assert (big["id"], 2) in _slices(server.errors())  # alone: both GPUs
    study = running["problems"][0]["study"]
    before = _trials(server, study)
    assert main(["cancel", str(big["id"]), "--server", server.base, "--token", tokens["read"]]) == 2
    assert "read scope" in capsys.readouterr().err
    assert main(["cancel", str(big["id"]), "--server", server.base, "--token", write, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "cancelled"
    _wait(lambda: not server.get(f"/jobs/{big['id']}")["held"])  # the slice running has stored its trials
    after = _trials(server, study)
    assert all(after.get(number) == config for number, config in before.items())  # nothing stored is lost
    assert len(set(after.values())) == len(after) < 200  # no config twice; stopped after the slice
    time.sleep(1.5)
    assert server.get(f"/jobs/{big['id']}")["state"] == "cancelled" and _trials(server, study) == after


@pytest.mark.soak
@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_a_scheduler_killed_and_started_again_resumes_every_job(url, tokens, tmp_path, capsys):
    first = Server(url, tmp_path, slice_trials=2)
    try:
        job = _submit(capsys, first.base, tokens["write"], "--shape", "2,8,1024,64", "--dtype", "fp16",
                      "--causal", "--trials", "6")
        _wait(lambda: first.get(f"/jobs/{job['id']}")["measured"] >= 2)
    finally:
        first.stop(signal.SIGKILL)
    second = Server(url, tmp_path, slice_trials=2)
    try:
        done = _wait(lambda: (found := second.get(f"/jobs/{job['id']}"))["state"] == "done" and found)
        trials = _trials(second, done["problems"][0]["study"])
        assert len(trials) == 6 and len(set(trials.values())) == 6  # every config measured once
    finally:
        assert "Traceback" not in second.stop(), second.errors()
