"""How many GPUs one coordinator keeps busy, by simulation (docs/BENCHMARKS.md, "Scale by
simulation").

    python3 docs/scripts/scale_sim.py [--gpus 1 8 32 64 128] [--dbs sqlite postgresql]
        [--modes tpe optuna-tpe] [--trials 500] [--time-limit 25] [--png docs/img/scale_sim.png]
        [--pg postgresql://postgres@127.0.0.1:5432/test] [--profile 64] [--landscape FILE]

Each run is one ``tuner.tune`` of the shortest attention landscape (4x8x512x64 fp16 causal, kernels
of 13-60 us: 27-36 ms of GPU time a trial, ``workers.simulate``) on N simulated GPUs, in a fresh
database (a SQLite file, or a PostgreSQL database made for the run and dropped after), seed 1,
no warm start, no re-timing; ``--trials`` trials or ``--time-limit`` seconds, whichever first.
A mode is the sampler: ``tpe`` (the default: a batch proposed at once) or ``optuna-tpe``
(Optuna's TPE asked one config at a time); leases and results go in batches either way. One Ray
for every run, with
``{"sim_gpu": max(gpus)}``. Prints a table and writes a PNG (busy share and trials/s against
GPUs); "busy steady" is the GPUs' busy share while every GPU is in play (from the last GPU's
first trial to the first GPU's last one: ``workers.simulate.steady_window``), the ramp-up and the
tail left out. ``--profile N``: cProfile of the coordinator's loop for the ``tpe`` run on N GPUs
(PostgreSQL when asked, else SQLite), its top functions printed (by cumulative time; another
pstats order by ``PROFILE_SORT``, e.g. ``tottime``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LANDSCAPE = ROOT / "tests/data/attention_4x8x512x64-fp16-causal_h200.json"
PROBLEM = ("attention", "4,8,512,64", "fp16", {"causal": True})


def fresh_database(kind: str, pg: str, tmp: Path) -> tuple[str, object]:
    """A URL of an empty database, and how to drop it."""
    if kind == "sqlite":
        path = tmp / f"{uuid.uuid4().hex[:8]}.db"
        return f"sqlite:///{path}", lambda: path.unlink(missing_ok=True)
    import psycopg

    name = f"scale_{uuid.uuid4().hex[:10]}"
    admin = pg.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    base = admin.rsplit("/", 1)[0]
    return f"postgresql+psycopg://{base.split('://', 1)[1]}/{name}", drop


def run(gpus: int, db: str, mode: str, trials: int, limit: float, profile: bool,
        landscape: Path = LANDSCAPE) -> dict:
    import tuner
    import tuner.study.loop as loop

    profiler = cProfile.Profile() if profile else None
    original = loop.Coordinator._loop
    if profiler is not None:
        def profiled(self):  # the coordinator's loop alone, not Ray's start or the database's
            profiler.enable()
            try:
                return original(self)
            finally:
                profiler.disable()
        loop.Coordinator._loop = profiled
    load = os.getloadavg()[0]
    try:
        result = tuner.tune(*PROBLEM, trials=trials, time_budget=limit, replay=str(landscape), db=db,
                            seed=1, retime=0, warm_start=0, simulate_gpus=gpus, sampler=mode)
    finally:
        loop.Coordinator._loop = original
    row = {"gpus": gpus, "mode": mode, "status": result.status, "reason": result.reason,
           "load_before": round(load, 1), **result.throughput.to_json()}
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats(os.environ.get("PROFILE_SORT", "cumulative"))
        stats.print_stats(int(os.environ.get("PROFILE_LINES", "30")))
        if os.environ.get("PROFILE_CALLERS"):  # a regex: who calls the functions it matches
            stats.print_callers(os.environ["PROFILE_CALLERS"])
        row["profile"] = out.getvalue()
    return row


def _steady(row: dict) -> str:
    """The steady state's busy share; a dash where there was none (a GPU that ran its last trial
    before the last GPU ran its first: few trials a GPU)."""
    return f"{100 * row['busy_steady_mean']:.0f}%" if row.get("steady_s") else "-"


def table(rows: list[dict]) -> str:
    head = ("| db | mode | GPUs | trials | wall s | trials/s | busy min | busy mean | busy steady | asks/s "
            "| ms an ask | DB writes/s | DB ms a trial | CPU ms a trial | sim late ms | load |")
    lines = [head, "|---" * 16 + "|"]
    for r in rows:
        lines.append(
            f"| {r['db']} | {r['mode']} | {r['gpus']} | {r['measured']} | {r['wall_s']:.1f} | "
            f"{r['trials_per_s']:.0f} | {100 * r['busy_min']:.0f}% | {100 * r['busy_mean']:.0f}% | "
            f"{_steady(r)} | {r['asks_per_s']:.0f} | {r['ask_ms']:.2f} | "
            f"{r['db_writes_per_s']:.0f} | {r['db_ms_per_trial']:.2f} | {r['cpu_ms_per_trial']:.2f} | "
            f"{r['simulator_late_ms']:.1f} | {r['load_before']:.1f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, landscape: str = LANDSCAPE.name) -> None:
    """Busy share (mean over the wall: solid; steady state: dotted) and trials/s against GPUs, a
    line for each database, mode and code (a row's ``code``: ``--replot`` labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (busy, rate) = plt.subplots(1, 2, figsize=(11, 4.4))
    codes = list(dict.fromkeys(r.get("code", "") for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines = sorted({(r["db"], r["mode"], r.get("code", "")) for r in rows},
                   key=lambda k: (codes.index(k[2]), k[0], k[1]))
    for n, (db, mode, code) in enumerate(lines):
        mine = sorted((r for r in rows if (r["db"], r["mode"], r.get("code", "")) == (db, mode, code)),
                      key=lambda r: r["gpus"])
        style = {"tpe": "-", "optuna-tpe": "--"}[mode]
        marker = "o" if db == "postgresql" else "s"
        label = ", ".join(x for x in (db, mode, code) if x)
        x = [r["gpus"] for r in mine]
        color = colors[n % len(colors)]
        busy.plot(x, [100 * r["busy_mean"] for r in mine], style, marker=marker, color=color, label=label)
        steady = [(r["gpus"], 100 * r["busy_steady_mean"]) for r in mine if r.get("steady_s")]
        if steady:
            busy.plot(*zip(*steady), ":", marker=marker, color=color, alpha=0.6, markersize=4)
        rate.plot(x, [r["trials_per_s"] for r in mine], style, marker=marker, color=color, label=label)
    gpus = sorted({r["gpus"] for r in rows})
    busy.axhline(90, color="grey", linewidth=0.8, linestyle=":")
    rate.plot(gpus, [g / 0.031 for g in gpus], color="grey", linewidth=0.8, linestyle=":",
              label="every GPU busy (31 ms a trial)")
    for ax in (busy, rate):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("simulated GPUs (one coordinator)")
    busy.set_ylabel("GPU busy share, % (solid: of the wall; dotted: steady)")
    rate.set_ylabel("measured trials per second")
    rate.set_yscale("log")
    busy.legend(fontsize=7)
    rate.legend(fontsize=7)
    fig.suptitle(f"attention 4x8x512x64 fp16 causal on simulated GPUs ({landscape}; 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--dbs", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--modes", nargs="+", default=["tpe", "optuna-tpe"], choices=["tpe", "optuna-tpe"])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--time-limit", type=float, default=25.0, help="seconds a run, at most")
    parser.add_argument("--pg", default=os.environ.get("TUNER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--png", type=lambda s: Path(s) if s else None, default=ROOT / "docs/img/scale_sim.png",
                        help="where the PNG goes (\"\": none)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--profile", type=int, metavar="GPUS", help="cProfile the after run on GPUS")
    parser.add_argument("--replot", nargs="+", metavar="JSON:LABEL", help="no runs: the PNG of rows "
                        "written by --json, each file's rows labelled (before and after a change, say)")
    parser.add_argument("--landscape", type=Path, default=LANDSCAPE, help="the landscape replayed (of "
                        "4x8x512x64 fp16 causal attention; docs/scripts/synthetic_landscape.py makes one of "
                        "every valid config, for runs longer than its 743 recorded trials)")
    args = parser.parse_args()
    if args.replot:
        if not args.png:
            parser.error("--replot writes a PNG: give --png FILE")
        rows = []
        for spec in args.replot:
            path, _, label = spec.partition(":")
            rows += [{**row, "code": label} for row in json.loads(Path(path).read_text())]
        plot(rows, args.png, args.landscape.name)
        print(f"wrote {args.png}")
        return 0

    import logging

    logging.basicConfig(level=logging.WARNING)
    from workers.ray_session import start_ray, stop_ray
    from workers.simulate import simulated_resources

    start_ray(resources=simulated_resources(max(args.gpus)))
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for db_kind in args.dbs:
                for mode in args.modes:
                    for gpus in args.gpus:
                        url, drop = fresh_database(db_kind, args.pg, Path(tmp))
                        try:
                            profile = args.profile == gpus and mode == "tpe" and db_kind == args.dbs[-1]
                            row = run(gpus, url, mode, args.trials, args.time_limit, profile, args.landscape)
                        finally:
                            drop()
                        row["db"] = db_kind
                        rows.append(row)
                        print(f"{db_kind} {mode} {gpus}: {row['measured']} trials, {row['trials_per_s']:.0f}/s, "
                              f"busy mean {100 * row['busy_mean']:.0f}%, steady {_steady(row)}",
                              flush=True)
    finally:
        stop_ray()
    print(table(rows))
    for row in rows:
        if "profile" in row:
            print(f"\ncProfile of the coordinator's loop, {row['db']} {row['mode']} {row['gpus']} GPUs:")
            print(row.pop("profile"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(rows, args.png, args.landscape.name)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
