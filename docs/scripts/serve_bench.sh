#!/usr/bin/env bash
# `tuner serve`'s /best under load on loopback (docs/BENCHMARKS.md, 2026-11-23):
#   bash docs/scripts/serve_bench.sh [DB] [RATE] [SECONDS]
# DB: a SQLite file written by docs/scripts/make_trials_db.py (made here when missing: 100,000
# trials). Queries: 50 tuned problems of the database and 10 shapes never tuned (answered by
# the rule), taken in turn. First a warm-up pass (each query once), then the open-loop run at
# RATE requests a second (docs/scripts/openloop.py; latency from when each request was due),
# then hey at the same rate (5 workers each throttled to RATE/5 a second: bursts of 5, and a
# worker waits for its answer, so not open-loop; a Go client, as a cross-check), then wrk's
# closed-loop run (4 connections, 10 s) for the most the server answers. Only 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
DB="${1:-/tmp/tuner-100k.db}"
RATE="${2:-500}"
SECONDS_="${3:-30}"
PORT=8780
PY=.venv/bin/python
[ -e "$DB" ] || $PY docs/scripts/make_trials_db.py "$DB" --trials 100000 2>/dev/null
URLS="$(mktemp)"
$PY - "$DB" "$PORT" > "$URLS" <<'EOF'
import json, random, sqlite3, sys
db, port = sys.argv[1], sys.argv[2]
rows = sqlite3.connect(db).execute("SELECT shape, dtype, flags FROM tuner_problems ORDER BY id").fetchall()
base = f"http://127.0.0.1:{port}/best?family=attention"
for shape, dtype, flags in random.Random(0).sample(rows, 50):
    causal = str(json.loads(flags)["causal"]).lower()
    print(f"{base}&shape={','.join(map(str, json.loads(shape)))}&dtype={dtype}&causal={causal}")
for shape in ("3,8,1000,64", "2,12,3000,128", "1,24,777,64", "6,8,2500,128", "5,16,1500,64"):
    for dtype, causal in (("fp16", "true"), ("bf16", "false")):
        print(f"{base}&shape={shape}&dtype={dtype}&causal={causal}")
EOF
.venv/bin/tuner serve --db "sqlite:///$(realpath "$DB")" --port "$PORT" 2>/dev/null &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -f "$URLS"' EXIT
for _ in $(seq 120); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/families" && break; sleep 0.5; done
echo "server up; cold pass (each query once, in turn):"
$PY docs/scripts/openloop.py --urls "$URLS" --rate 20 --seconds 3
cpu() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }  # utime + stime, in 10 ms ticks
echo "open loop at $RATE/s for $SECONDS_ s (load average before: $(cut -d' ' -f1-3 /proc/loadavg)):"
before=$(cpu)
$PY docs/scripts/openloop.py --urls "$URLS" --rate "$RATE" --seconds "$SECONDS_" --json
after=$(cpu)
echo "server CPU: $(( (after - before) * 10 )) ms for $(python3 -c "print(int($RATE * $SECONDS_))") requests; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if command -v hey >/dev/null; then
    echo "hey, 5 workers at 100 requests a second each ($RATE/s in bursts of 5), 30 s, one tuned query:"
    hey -z 30s -c 5 -q $(( RATE / 5 )) "$(head -1 "$URLS")" | grep -E "Requests/sec|Slowest|Fastest|Average|% in|\[2|\[4|\[5"
fi
if command -v wrk >/dev/null; then
    echo "wrk, closed loop, 4 connections, 10 s, one tuned query:"
    wrk -t1 -c4 -d10s --latency "$(head -1 "$URLS")" | grep -E "Latency|50%|90%|99%|Requests/sec"
fi
