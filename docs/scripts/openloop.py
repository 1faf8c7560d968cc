"""An open-loop HTTP load generator for loopback: requests sent at a fixed rate, whatever the answers do.

    .venv/bin/python docs/scripts/openloop.py --rate 500 --seconds 30 --urls urls.txt

Request i is due at start + i / rate. It goes out at that time on a free keep-alive connection
(a new one is opened when every one is busy, up to ``--max-connections``), and its latency is
counted from when it was due to when its whole answer has arrived: a server that falls behind
shows it in the latencies, instead of slowing the sender down (no coordinated omission). The
URLs (one a line, or ``--url``) are taken in turn. Bounded: at most ``--seconds`` of sending,
100,000 requests, 10 s a request, and only to 127.0.0.1, ::1 or localhost. Prints percentiles; ``--json`` too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from urllib.parse import urlsplit

MAX_REQUESTS = 100_000
TIMEOUT_S = 10.0  # a request not answered by then counts as an error (its connection is dropped)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


async def fetch(pool: asyncio.Queue, opened: list[int], host: str, port: int, target: str,
                limit: int) -> int:
    """Send one GET on a free connection (or a new one) and read the answer; its status."""
    try:
        reader, writer = pool.get_nowait()
    except asyncio.QueueEmpty:
        if opened[0] >= limit:
            reader, writer = await pool.get()
        else:
            opened[0] += 1
            reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    pool.put_nowait((reader, writer))
    return status


async def run(urls: list[str], rate: float, seconds: float, limit: int) -> dict:
    parts = [urlsplit(url) for url in urls]
    host, port = parts[0].hostname, parts[0].port or 80
    targets = [p.path + (f"?{p.query}" if p.query else "") for p in parts]
    count = min(MAX_REQUESTS, int(rate * seconds))
    pool: asyncio.Queue = asyncio.Queue()
    opened = [0]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()

    async def one(due: float, target: str) -> None:
        try:
            status = await asyncio.wait_for(fetch(pool, opened, host, port, target, limit), TIMEOUT_S)
            if status != 200:
                errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.TimeoutError) as error:
            errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
            return
        latencies.append(loop.time() - due)

    start = loop.time() + 0.1
    tasks = []
    for i in range(count):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due, targets[i % len(targets)])))
    await asyncio.gather(*tasks)
    sent_s = loop.time() - start
    while not pool.empty():
        pool.get_nowait()[1].close()
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {"requests": count, "ok": len(ordered), "errors": errors, "rate": rate, "seconds": round(sent_s, 2),
            "achieved_rps": round(len(ordered) / sent_s, 1), "connections": opened[0],
            "p50_ms": round(pct(0.50), 3), "p90_ms": round(pct(0.90), 3), "p99_ms": round(pct(0.99), 3),
            "p999_ms": round(pct(0.999), 3), "max_ms": round(1000 * ordered[-1], 3) if ordered else None,
            "mean_ms": round(1000 * statistics.fmean(ordered), 3) if ordered else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", default=[], help="a URL to GET (repeatable)")
    parser.add_argument("--urls", help="a file of URLs, one a line, taken in turn")
    parser.add_argument("--rate", type=float, default=500.0, help="requests a second (default 500)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to send (default 30)")
    parser.add_argument("--max-connections", type=int, default=64, help="default 64")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    urls = list(args.url)
    if args.urls:
        with open(args.urls) as handle:
            urls += [line.strip() for line in handle if line.strip()]
    if not urls:
        parser.error("give --url or --urls")
    hosts = {urlsplit(u).hostname for u in urls} | {urlsplit(u).port for u in urls}
    if any(urlsplit(u).hostname not in LOOPBACK or urlsplit(u).scheme != "http" for u in urls) or len(hosts) != 2:
        parser.error("every URL must be http:// on one loopback host and port (127.0.0.1, ::1, localhost)")
    if not 0 < args.rate <= 10_000 or not 0 < args.seconds <= 600:
        parser.error("--rate must be in (0, 10000] and --seconds in (0, 600]")
    result = asyncio.run(run(urls, args.rate, args.seconds, args.max_connections))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['ok']}/{result['requests']} ok at {result['rate']:g}/s for {result['seconds']} s "
              f"({result['achieved_rps']} answered/s, {result['connections']} connections); latency ms "
              f"p50 {result['p50_ms']} p90 {result['p90_ms']} p99 {result['p99_ms']} "
              f"p99.9 {result['p999_ms']} max {result['max_ms']}; errors {result['errors'] or 'none'}")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
