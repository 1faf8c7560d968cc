"""Trials a minute of `tuner serve --run-jobs` on simulated GPUs: one job alone on one GPU against
as many jobs as GPUs at once, each on its own (docs/BENCHMARKS.md, "Serving and the dashboard
copy": jobs sharing GPUs).

    .venv/bin/python docs/scripts/jobs_gpus.py --trials 160 --rounds 2
    python3 docs/scripts/jobs_gpus.py --real --trials 160 --slice-trials 160 --rounds 1   # GPUs of this machine

Each run is a fresh SQLite database in a temporary folder and a server of its own, replaying the
attention landscapes on ``G`` simulated GPUs (``--simulate-gpus``: each trial takes its GPU time),
with ``G`` jobs of ``--trials`` trials submitted at once, each a problem of its own (alone: one
job, each round another of those problems). A run's
trials a minute: the trials its jobs measured over the time from the first job's start to the
last one's end (the slices' pools starting, the studies opening and the final re-timings
included); ``all_cpu_ms_a_trial``: the CPU time of the server and every process it started (Ray,
its workers, the Optuna copies), from start to stop, a trial. The runs alternate (1 GPU, then 2), so that the machine's other load falls on both.
``--real``: the machine's own GPUs measure instead (the server sees the first ``G`` through
``CUDA_VISIBLE_DEVICES``; alone, the first).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPES = (ROOT / "templates" / "attention" / "landscapes", ROOT / "tests" / "data")
# a trial's simulated GPU time: 39, 35, 45 and 57 ms on average (workers.simulate.gpu_time)
PROBLEMS = ({"shape": "2,8,1024,64", "dtype": "fp16", "flags": {"causal": True}},
            {"shape": "4,8,512,64", "dtype": "fp16", "flags": {"causal": True}},
            {"shape": "4,8,1024,64", "dtype": "bf16", "flags": {"causal": True}},
            {"shape": "1,16,2048,64", "dtype": "fp16", "flags": {"causal": True}})


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _call(base: str, path: str, body: dict | None = None, token: str | None = None) -> object:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=30) as answer:
        return json.loads(answer.read())


def _cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) of process ``pid`` so far: the server's own, its threads
    (each running study's coordinator) included, Ray's processes not."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(gpus: int, problems: tuple[dict, ...], trials: int, slice_trials: int, folder: Path,
             real: bool = False) -> dict:
    """One server on ``gpus`` GPUs (simulated unless ``real``) running a job of each of ``problems``;
    their trials a minute."""
    python = sys.executable
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    url = f"sqlite:///{folder / f'jobs-{gpus}.db'}"
    token = subprocess.run([python, "-m", "tuner", "token", "create", "--scope", "write", "--db", url], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    port = _port()
    base = f"http://127.0.0.1:{port}"
    log = open(folder / f"serve-{gpus}.log", "w")
    measure = ["--simulate-gpus", str(gpus), "--replay", *map(str, LANDSCAPES)] if not real else []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))} if real else None
    server = subprocess.Popen([python, "-m", "tuner", "serve", "--db", url, "--port", str(port), "--run-jobs",
                               "--slice-trials", str(slice_trials), *measure],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        for _ in range(240):
            try:
                _call(base, "/jobs")
                break
            except OSError:
                if server.poll() is not None:
                    log.flush()
                    tail = (folder / f"serve-{gpus}.log").read_text().splitlines()[-5:]
                    raise SystemExit(f"the server exited ({server.returncode}):\n" + "\n".join(tail))
                time.sleep(0.5)
        load, cpu = os.getloadavg()[0], _cpu_seconds(server.pid)
        ids = [_call(base, "/jobs", {"family": "attention", "trials": trials, "seed": 0, "problems": [problem]},
                     token)["id"] for problem in problems]
        while True:
            jobs = [j for j in _call(base, "/jobs") if j["id"] in ids]
            if all(j["state"] not in ("queued", "running") for j in jobs):
                break
            time.sleep(1.0)
        cpu = _cpu_seconds(server.pid) - cpu
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
        log.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    every = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    start = min(datetime.fromisoformat(j["started_at"]) for j in jobs)
    end = max(datetime.fromisoformat(j["finished_at"]) for j in jobs)
    seconds = (end - start).total_seconds()
    measured = sum(j["measured"] for j in jobs)
    return {"gpus": gpus, "jobs": len(jobs), "shapes": [p["shape"] for p in problems], "states": sorted({j["state"] for j in jobs}), "trials": measured,
            "seconds": round(seconds, 1), "trials_per_min": round(60 * measured / seconds, 1),
            "server_cpu_s": round(cpu, 1), "all_cpu_ms_a_trial": round(1000 * every / measured),
            "load_before": round(load, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=160, help="each job's trials (default 160)")
    parser.add_argument("--slice-trials", type=int, default=8, help="the server's slice (default 8)")
    parser.add_argument("--gpus", type=int, default=2, help="the GPUs of the shared runs (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each kind, alternating (default 2)")
    parser.add_argument("--real", action="store_true", help="this machine's GPUs measure, not simulated ones")
    parser.add_argument("--logs", help="keep the servers' logs in this folder")
    args = parser.parse_args()
    if not 1 < args.gpus <= len(PROBLEMS):
        parser.error(f"--gpus takes 2 to {len(PROBLEMS)}")
    rates: dict[int, list[float]] = {1: [], args.gpus: []}
    with tempfile.TemporaryDirectory(prefix="jobs-gpus-") as folder:
        for round_ in range(1, args.rounds + 1):
            # alone: each round another of the shared run's problems, so that the rounds average over them
            first = PROBLEMS[(round_ - 1) % args.gpus]
            alone = run_once(1, (first,), args.trials, args.slice_trials, Path(folder), args.real)
            shared = run_once(args.gpus, PROBLEMS[:args.gpus], args.trials, args.slice_trials, Path(folder), args.real)
            for found in (alone, shared):
                rates[found["gpus"]].append(found["trials_per_min"])
                print(json.dumps({"round": round_, **found}), flush=True)
            print(f"round {round_}: {args.gpus} jobs on {args.gpus} GPUs: "
                  f"{shared['trials_per_min'] / alone['trials_per_min']:.2f}x one job on one GPU", flush=True)
            for name in os.listdir(folder):
                if args.logs and name.endswith(".log"):
                    os.makedirs(args.logs, exist_ok=True)
                    os.replace(Path(folder) / name, Path(args.logs) / f"{round_}-{name}")
                else:
                    os.remove(Path(folder) / name)
    mean = {gpus: sum(found) / len(found) for gpus, found in rates.items()}
    print(f"mean trials/min: {mean[1]:.0f} one job on one GPU, {mean[args.gpus]:.0f} {args.gpus} jobs on "
          f"{args.gpus} GPUs: {mean[args.gpus] / mean[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
