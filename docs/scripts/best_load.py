"""`/best` under load against a running `tuner serve`, while its jobs run (docs/BENCHMARKS.md,
"Serving and the dashboard copy").

    .venv/bin/python docs/scripts/best_load.py --db /tmp/tuner-100k.db --rate 200 --seconds 30 \
        --server http://127.0.0.1:8765 --submit 2 --token "$TOKEN"

The queries: 50 problems tuned in the SQLite database ``--db`` the server serves (one written by
docs/scripts/make_trials_db.py) and 10 shapes never tuned (answered by the rule), taken in turn,
sent open-loop at ``--rate`` a second for ``--seconds`` (docs/scripts/openloop.py: latency from
when each request was due). ``--submit K``: first queue K attention jobs of 100,000 trials with
the write ``--token``, wait until each has trials stored, and cancel them after the load; the
jobs' trials stored during the load are printed beside the latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openloop import run  # noqa: E402

# problems with a landscape to replay, and no H200 study in make_trials_db.py's database
JOB_PROBLEMS = ({"shape": "2,8,1024,64", "dtype": "fp16", "flags": {"causal": True}},
                {"shape": "4,8,1024,64", "dtype": "bf16", "flags": {"causal": True}},
                {"shape": "1,16,2048,64", "dtype": "fp16", "flags": {"causal": True}})
UNTUNED = ("3,8,1000,64", "2,12,3000,128", "1,24,777,64", "6,8,2500,128", "5,16,1500,64")


def best_urls(db: str, server: str) -> list[str]:
    """50 tuned problems of ``db`` and 10 never tuned, as ``/best`` URLs of ``server``."""
    rows = sqlite3.connect(db).execute("SELECT shape, dtype, flags FROM tuner_problems ORDER BY id").fetchall()
    base = f"{server}/best?family=attention"
    urls = []
    for shape, dtype, flags in random.Random(0).sample(rows, min(50, len(rows))):
        causal = str(json.loads(flags)["causal"]).lower()
        urls.append(f"{base}&shape={','.join(map(str, json.loads(shape)))}&dtype={dtype}&causal={causal}")
    for shape in UNTUNED:
        urls += [f"{base}&shape={shape}&dtype=fp16&causal=true", f"{base}&shape={shape}&dtype=bf16&causal=false"]
    return urls


def _call(url: str, method: str = "GET", body: dict | None = None, token: str | None = None) -> object:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _measured(server: str, ids: list[int]) -> int:
    return sum(j["measured"] for j in _call(f"{server}/jobs") if j["id"] in ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the SQLite file the server serves")
    parser.add_argument("--server", default="http://127.0.0.1:8765")
    parser.add_argument("--rate", type=float, default=200.0, help="requests a second (default 200)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument("--submit", type=int, default=0, help="jobs to queue first, and cancel after")
    parser.add_argument("--token", help="a write token, for --submit")
    args = parser.parse_args()
    if args.submit and not args.token:
        parser.error("--submit needs --token")
    server = args.server.rstrip("/")
    ids = [_call(f"{server}/jobs", "POST", {"family": "attention", "trials": 100_000, "seed": 0,
                                            "problems": [JOB_PROBLEMS[i % len(JOB_PROBLEMS)]]}, args.token)["id"]
           for i in range(args.submit)]
    try:
        deadline = time.monotonic() + 120
        while ids and not all(j["measured"] > 0 for j in _call(f"{server}/jobs") if j["id"] in ids):
            if time.monotonic() > deadline:
                raise SystemExit("the jobs stored no trial within 120 s")
            time.sleep(0.5)
        before = _measured(server, ids)
        result = asyncio.run(run(best_urls(args.db, server), args.rate, args.seconds, 64))
        stored = _measured(server, ids) - before
    finally:
        for job in ids:
            _call(f"{server}/jobs/{job}", "DELETE", token=args.token)
    print(json.dumps({**result, "jobs": len(ids), "job_trials_during": stored,
                      "job_trials_per_min": round(60 * stored / result["seconds"], 1)}))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
