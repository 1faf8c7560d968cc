"""The ``tuner`` command: argparse over :mod:`tuner.api`, and nothing else.

    tuner tune attention --shape 4,16,4096,128 --dtype fp16 --causal --time-budget 30m
    tuner best attention --shape 4,16,4096,128 --dtype fp16 --causal --json
    tuner export attention --shape 4,16,4096,128 --dtype fp16 --causal -o out/
    tuner studies
    tuner show 'attention/4x16x4096x128-fp16-causal/H100-80GB-HBM3/3f9a0c1d2e4b5a6c'
    tuner serve --run-jobs; tuner submit attention --shape 4,16,4096,128 --dtype fp16 --causal --trials 200

Every user error prints one line ``tuner: error: ...`` on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Sequence

from tuner import api
from tuner.answers.exporter import launch_path
from tuner.cli import check, export_dispatch, export_torch, guard, lint
from tuner.cli import jobs as job_commands
from tuner.cli import text as report
from tuner.errors import TunerError, UsageError
from tuner.logs import log_to_stderr
from tuner.reports.bench import bench as run_bench
from tuner.reports.bench import suite_of
from tuner.reports.bench_search import DEFAULT_SAMPLERS as SEARCH_SAMPLERS
from tuner.reports.bench_search import IN_FLIGHT
from tuner.reports.bench_search import bench_search, check_plot
from tuner.reports.bench_search import plot as plot_search
from tuner.reports.landscape import record_landscape
from tuner.reports.study_plot import plot_study
from workers.pool_options import PoolOptions
from tuner.study import search
from tuner.study.model import DEFAULT_TOKENS, parse_tokens
from tuner.study.model import DTYPES as MODEL_DTYPES
from tuner.study.options import StudyOptions
from tuner.study.progress import format_params

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_DURATION = re.compile(r"(\d+(?:\.\d*)?)\s*([hms]?)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}
_DASHED_VALUE = re.compile(r"-\.?\d")  # a negative number, or numbers after one (a shape)


def parse_duration(text: str) -> float:
    """``"30m"`` -> 1800.0; also ``"90s"``, ``"2h"``, ``"1h30m"`` and plain seconds ``"45"``."""
    compact = text.strip().lower().replace(" ", "")
    parts = list(_DURATION.finditer(compact))
    if not compact or "".join(p.group(0) for p in parts) != compact:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (like 90s, 30m, 2h, 1h30m)")
    seconds = sum(float(p.group(1)) * _UNIT_SECONDS[p.group(2)] for p in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"the time budget must be positive, not {text!r}")
    if not seconds <= api.MAX_TIME_BUDGET_S:
        raise argparse.ArgumentTypeError(f"must be at most a year (8760h), not {text!r}")
    return seconds


def _whole_number(text: str, minimum: int, bound: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {bound}, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _count(text: str) -> int:
    return _whole_number(text, 0, "0 or more")


def _positive_int(text: str) -> int:
    return _whole_number(text, 1, "at least 1")


def _tokens(text: str) -> tuple[int, ...]:
    try:
        return parse_tokens(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("tokens: ")) from None


def _port(text: str) -> int:
    value = _whole_number(text, 0, "a port, 0-65535")
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port, 0-65535, not {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line ``tuner: error: ...`` (no usage block)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"tuner: error: {message}\n")


# tpe-batch: the default's name before it was the default (accepted, with a notice)
SAMPLER_CHOICES = (*search.SAMPLERS, *search.RENAMED)
SAMPLER_HELP = ("tpe (default): TPE proposing a batch at once; optuna-tpe: Optuna's TPE, one ask a "
                "config (slower: its asks can keep GPUs waiting on short kernels); random; grid")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Autotune CUDA kernel families on GPUs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    common = _Parser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging")
    common.add_argument("--db", metavar="URL", help="database URL (default: $TUNER_DB or ./tuner.db)")
    problem = _Parser(add_help=False)
    problem.add_argument("family", help="kernel family, e.g. attention")
    problem.add_argument("--shape", required=True,
                         help="problem shape, e.g. 4,16,4096,128 (B,H,N,D); then the family's own "
                              "flags, e.g. --causal for attention")
    problem.add_argument("--dtype", required=True, help="element type, e.g. fp16 or bf16")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    tune = sub.add_parser("tune", parents=[problem, common], help="search for the fastest config")
    budget = tune.add_mutually_exclusive_group()
    budget.add_argument("--trials", type=_positive_int, metavar="N",
                        help="stop after N measured trials of the study (default 100; grid: all)")
    budget.add_argument("--time-budget", type=parse_duration, metavar="DURATION",
                        help="stop after this long, e.g. 90s, 30m, 2h")
    tune.add_argument("--sampler", choices=SAMPLER_CHOICES, default="tpe", help=SAMPLER_HELP)
    tune.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster")
    tune.add_argument("--replay", metavar="FILE", help="answer from a recorded landscape (no GPU)")
    tune.add_argument("--seed", type=int, metavar="N", help="sampler seed")
    tune.add_argument("--measure-timeout", type=_seconds, default=60.0, metavar="SECONDS",
                      help="a measurement running longer is killed (default 60)")
    tune.add_argument("--warm-start", type=_count, default=3, metavar="N",
                      help="first try the family's starting points and the winners of the N nearest tuned problems (default 3; 0: neither)")
    tune.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                      help="time every candidate in full (for landscapes), not only those near the best")
    tune.add_argument("--retime", type=_count, default=5, metavar="N",
                      help="at the end, time the N fastest trials again interleaved and pick the "
                           "winner by those medians (default 5; 0: off)")
    tune.add_argument("--simulate-gpus", type=_positive_int, metavar="N",
                      help="with --replay: N simulated GPUs, each taking a trial's GPU time "
                           "(how many GPUs one coordinator keeps busy)")
    tune.add_argument("--no-batch", action="store_true", help=argparse.SUPPRESS)  # no longer has an effect
    tune.add_argument("--no-constant-liar", dest="constant_liar", action="store_false",
                      help="TPE: trials in flight do not count as bad results while proposing")
    tune.add_argument("--json", action="store_true", help="print the run's summary as JSON")

    many = sub.add_parser("tune-many", parents=[common],
                          help="tune a list of problems (a YAML file), each to the budget; resumable")
    many.add_argument("family", help="kernel family, e.g. attention")
    many.add_argument("--shapes", required=True, metavar="FILE",
                      help="YAML: a list of problems, each {shape: 2,8,1024,64, dtype: fp16, flags: {...}}")
    _list_arguments(many)

    model = sub.add_parser("tune-model", parents=[common],
                           help="tune one transformer layer's GEMMs and attention from a Hugging Face "
                                "config.json, each problem to the budget; resumable")
    model.add_argument("config", metavar="CONFIG.json", help="the model's config.json")
    model.add_argument("--tokens", type=_tokens, default=DEFAULT_TOKENS, metavar="LIST",
                       help="token counts (the GEMMs' M, attention's sequence length), comma-separated "
                            "(default 1,2,4,...,8192)")
    model.add_argument("--dtype", choices=sorted(set(MODEL_DTYPES.values())),
                       help="instead of the config's torch_dtype")
    model.add_argument("--separate-gate-up", action="store_true",
                       help="gate and up as two weights of intermediate_size rows (default: one of twice that)")
    model.add_argument("--lm-head", action="store_true", help="also the output head (vocab_size x hidden_size)")
    model.add_argument("--dry-run", action="store_true",
                       help="print the problems as tune-many YAML (a document a family) and tune nothing")
    _list_arguments(model)

    cover = sub.add_parser("coverage", parents=[common],
                           help="which problems are tuned, where, how fast and how long ago; the rule's score")
    cover.add_argument("family", help="kernel family, e.g. attention")
    cover.add_argument("--json", action="store_true", help="print JSON")

    best = sub.add_parser("best", parents=[problem, common], help="print the stored winner")
    best.add_argument("--json", action="store_true", help="print JSON")
    best.add_argument("--device", metavar="GPU", help="only results on this GPU name")
    best.add_argument("--validate", action="store_true",
                      help="for a problem never tuned: measure the config picked for it on the GPU "
                           "(or --replay) and store it")
    best.add_argument("--replay", metavar="FILE", help="with --validate: measure on a recorded landscape")
    best.add_argument("--ray-address", metavar="ADDR", help="with --validate: join this Ray cluster")

    export = sub.add_parser("export", parents=[problem, common], help="write the winner's .cu and .launch.json")
    export.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder")
    export.add_argument("--device", metavar="GPU", help="only results on this GPU name")

    studies = sub.add_parser("studies", parents=[common], help="list stored studies")
    studies.add_argument("--json", action="store_true", help="print JSON")

    bench = sub.add_parser("bench", parents=[common],
                           help="time stored winners beside their peers (torch SDPA) on this GPU")
    bench.add_argument("family", help="kernel family, e.g. attention")
    bench.add_argument("--shape", help="one problem instead of the family's suite, e.g. 4,16,4096,128")
    bench.add_argument("--shapes", metavar="FILE",
                       help="the problems of a YAML list (as tune-many takes) instead of the suite")
    bench.add_argument("--dtype", help="element type of --shape, or only the suite's problems of it")
    bench.add_argument("--tune", type=_positive_int, metavar="N",
                       help="first tune each problem to N trials (resumes what is stored)")
    bench.add_argument("--json", action="store_true", help="print JSON")

    searchbench = sub.add_parser("bench-search", help="compare samplers on recorded landscapes")
    searchbench.add_argument("landscapes", nargs="+", metavar="FILE", help="landscape JSON files")
    searchbench.add_argument("--seeds", type=_positive_int, default=20, help="runs per sampler (default 20)")
    searchbench.add_argument("--samplers", nargs="+", default=list(SEARCH_SAMPLERS),
                             help=f"samplers to compare (default: {' '.join(SEARCH_SAMPLERS)})")
    searchbench.add_argument("--in-flight", type=_positive_int, default=IN_FLIGHT, metavar="K",
                             help=f"trials in flight, as a study keeps them (default {IN_FLIGHT}; 1: one at a time)")
    searchbench.add_argument("--family", metavar="REF",
                             help="the landscapes' family where it is not installed (a path or module:ATTR)")
    searchbench.add_argument("--png", metavar="FILE", help="also plot best-so-far curves to FILE")
    searchbench.add_argument("--json", action="store_true", help="print JSON")
    searchbench.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="debug logging")

    landscape = sub.add_parser("landscape", parents=[common],
                               help="write a study's trials as a replay landscape (JSON)")
    landscape.add_argument("study", metavar="STUDY", help="study name or id (see `tuner studies`)")
    landscape.add_argument("-o", "--out", required=True, metavar="FILE",
                           help="landscape file to write (a name ending in .json.gz: compressed by gzip)")

    export_dispatch.add_parser(sub, common)
    export_torch.add_parser(sub, common)
    guard.add_parser(sub, common, _positive_int)

    serve = sub.add_parser("serve", parents=[common],
                           help="serve the stored results read-only over HTTP (JSON API and a page)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=_port, default=8765, help="port (default 8765)")
    serve.add_argument("--run-jobs", action="store_true",
                       help="also run the jobs clients queue (tuner submit), by priority, in this process")
    serve.add_argument("--replay", nargs="+", metavar="FILE",
                       help="with --run-jobs: answer from recorded landscapes (files or folders), no GPU")
    serve.add_argument("--slice-trials", type=_positive_int, default=8, metavar="N",
                       help="with --run-jobs: trials of one problem a turn, before the next job's (default 8)")
    serve.add_argument("--ray-address", metavar="ADDR", help="with --run-jobs: join this Ray cluster")
    serve.add_argument("--simulate-gpus", type=_positive_int, metavar="N",
                       help="with --run-jobs --replay: N simulated GPUs, shared among the jobs as GPUs are")
    serve.add_argument("--measure-timeout", type=_seconds, default=60.0, metavar="SECONDS",
                       help="with --run-jobs: a measurement running longer is killed (default 60)")

    plot = sub.add_parser("report", parents=[common],
                          help="one study as a PNG: best so far, importances, failures; or a torch package's "
                               "table (--package)")
    plot.add_argument("study", metavar="STUDY", nargs="?", help="study name or id (see `tuner studies`)")
    plot.add_argument("-o", "--out", metavar="FILE", help="PNG file to write (with STUDY)")
    plot.add_argument("--package", metavar="DIR",
                      help="instead: a package of export-torch as a markdown table, ours against the vendor's path")
    plot.add_argument("--json", action="store_true", help="with --package: print JSON")

    show = sub.add_parser("show", parents=[common], help="one study and its trials")
    show.add_argument("study", metavar="STUDY", help="study name or id (see `tuner studies`)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--optuna", metavar="TARGET",
                      help="also copy the study to an Optuna storage for optuna-dashboard: "
                           "an RDB URL (sqlite:///optuna.db) or a journal file path")
    check.add_parser(sub, common, _seconds)
    lint.add_parser(sub, common)
    job_commands.add_parsers(sub, common, _positive_int)
    return parser


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``tune-many`` and ``tune-model`` share: each problem's budget and search, --replay, --json."""
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--trials", type=_positive_int, metavar="N",
                        help="each problem's study to N measured trials (default 100)")
    budget.add_argument("--time-budget", type=parse_duration, metavar="DURATION",
                        help="each problem this long, e.g. 90s, 30m, 2h")
    parser.add_argument("--sampler", choices=SAMPLER_CHOICES, default="tpe", help=SAMPLER_HELP)
    parser.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster")
    parser.add_argument("--replay", nargs="+", metavar="FILE",
                        help="answer from recorded landscapes: files or folders, one recording each problem")
    parser.add_argument("--seed", type=int, metavar="N", help="sampler seed")
    parser.add_argument("--measure-timeout", type=_seconds, default=60.0, metavar="SECONDS",
                        help="a measurement running longer is killed (default 60)")
    parser.add_argument("--warm-start", type=_count, default=3, metavar="N",
                        help="start each study from the winners of the N nearest tuned problems and "
                             "the family's starting points (default 3; 0: neither)")
    parser.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                        help="time every candidate in full")
    parser.add_argument("--retime", type=_count, default=5, metavar="N",
                        help="re-time each study's N fastest trials at its end (default 5; 0: off)")
    parser.add_argument("--json", action="store_true", help="print each problem's summary as JSON")


FAMILY_COMMANDS = ("tune", "best", "export", "bench", "submit")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(_shape_values(sys.argv[1:] if argv is None else argv))
    _setup_logging(args.verbose)
    with _terminate_as_interrupt():
        return _main(parser, args, rest)


def _shape_values(argv: Sequence[str]) -> list[str]:
    """``--shape -2,8,1024,64`` as ``--shape=-2,8,1024,64``: argparse takes a value that starts
    with a dash and is not one number for an option, and says only that ``--shape`` expected one
    argument; joined, the family says what is wrong with the shape."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1] == "--shape" and _DASHED_VALUE.match(arg):
            joined[-1] = f"--shape={arg}"
        else:
            joined.append(arg)
    return joined


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (what ``kill`` and a batch system send) ends a command as Ctrl-C does: a study
    keeps what finished, leaves what was in flight to the next run, and its Ray stops with it.
    Python's default for SIGTERM is to die where it stands: with Ray's threads up, an abort and
    a native stack dump. Only where this is the main thread (signals go to it alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> int:
    try:
        args.flags = _family_flags(args, rest) if args.command in FAMILY_COMMANDS else None
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except BrokenPipeError:  # the reader has what it wanted (`tuner show ... | head`)
        _stdout_to_devnull()
        return 0
    except TunerError as error:
        print(f"tuner: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _family_flags(args: argparse.Namespace, rest: list[str]) -> dict[str, Any]:
    """The problem flags the family declares, read off ``rest`` (what they leave stays there):
    a switch as ``--name``, a choice as ``--name VALUE``."""
    from tuner.lookup import family

    declared = family(args.family).flags
    flag_parser = _Parser(prog=f"tuner {args.command} {args.family}", add_help=False)
    for flag in declared:
        option = "--" + flag.name.replace("_", "-")
        if flag.switch:
            flag_parser.add_argument(option, dest=flag.name, action="store_true", default=None, help=flag.doc)
        else:
            flag_parser.add_argument(option, dest=flag.name, choices=[str(c) for c in flag.choices],
                                     default=None, help=flag.doc)
    given, left = flag_parser.parse_known_args(rest)
    rest[:] = left
    return {name: value for name, value in vars(given).items() if value is not None}


# -- the commands: call the API, print what it returned -------------------------------------------
def _study_options(args: argparse.Namespace) -> StudyOptions:
    """``tune``'s and ``tune-many``'s search arguments, once."""
    return StudyOptions(trials=args.trials, time_budget=args.time_budget, sampler=args.sampler,
                        seed=args.seed, warm_start=args.warm_start, retime=args.retime,
                        early_stop=args.early_stop, constant_liar=getattr(args, "constant_liar", True))


def _pool_options(args: argparse.Namespace, **fields: Any) -> PoolOptions:
    """Where ``tune``'s and ``tune-many``'s trials are measured, once (``fields``: replaced)."""
    where = PoolOptions(ray_address=args.ray_address, replay=getattr(args, "replay", None),
                        measure_timeout_s=args.measure_timeout,
                        simulate_gpus=getattr(args, "simulate_gpus", None))
    return replace(where, **fields)


def _tune(args: argparse.Namespace) -> int:
    if args.no_batch:
        logging.getLogger("tuner").warning("--no-batch no longer has an effect: trials are always asked, leased and stored in batches")
    result = api.tune(args.family, args.shape, args.dtype, args.flags, db=args.db,
                      options=_study_options(args), pool=_pool_options(args))
    code = EXIT_INTERRUPTED if result.status == "interrupted" else 0
    if args.json:
        print(json.dumps(report.plain(result), indent=2))
        return code
    print(f"study     {result.study}")
    print(f"status    {result.status}: {result.reason}")
    print(f"trials    {result.measured} measured ({result.failed} failed), {result.reused} reused, "
          f"{result.invalid} invalid, {result.previous} from earlier runs"
          + (f", {result.shared} by other coordinators" if result.shared else ""))
    print(f"time      {report.time_line(result)}")
    if args.simulate_gpus:
        print(f"simulated {report.throughput_line(result.throughput)}")
    if result.best is None:
        print("best      no validated config yet")
    else:
        print(f"best      {report.best_line(result.best)}")
    if result.retimed:
        print(f"re-timed  {report.retimed_line(result.retimed)}")
    for pick in result.warm_start:
        how = f"{pick.ratio_to_best:.2f}x the best" if pick.ratio_to_best else "failed here"
        print(f"warm      from {pick.source}: {how}  {format_params(pick.params)}")
    for line in report.fault_lines(result):
        print(line)
    return code


def _tune_many(args: argparse.Namespace) -> int:
    from tuner.study.many import tune_many

    done = tune_many(args.family, args.shapes, db=args.db, replay=args.replay,
                     options=_study_options(args), pool=_pool_options(args, replay=None))
    stopped = any(d.result is None or d.result.status == "interrupted" for d in done)
    if args.json:
        print(json.dumps([{"problem": d.problem, "result": report.plain(d.result)} for d in done], indent=2))
        return EXIT_INTERRUPTED if stopped else 0
    for d in done:
        r = d.result
        if r is None:
            print(f"{d.problem}  not reached")
            continue
        best = report.best_line(r.best) if r.best is not None else "no validated config yet"
        print(f"{d.problem}  {r.status}: {r.reason}; {r.measured} measured now, {r.previous} before; "
              f"best {best}")
    return EXIT_INTERRUPTED if stopped else 0


def _tune_model(args: argparse.Namespace) -> int:
    from tuner.study import model

    shape = model.read_config(args.config, dtype=args.dtype, lm_head=args.lm_head,
                              gate_up="separate" if args.separate_gate_up else "fused")
    plan = model.plan_model(shape, args.tokens)
    if args.dry_run:
        print(model.plan_yaml(plan), end="")
        return 0
    run = model.tune_model(plan, db=args.db, replay=args.replay, options=_study_options(args),
                           pool=_pool_options(args, replay=None))
    stopped = any(d.result is None or d.result.status == "interrupted" for d in run.done)
    if args.json:
        print(json.dumps({"problems": [{"family": d.family, "problem": d.problem, "roles": list(p.roles),
                                        "tokens": p.tokens, "result": report.plain(d.result)}
                                       for p, d in zip(run.plan.problems, run.done)],
                          "skipped": [report.plain(s) for s in run.skipped]}, indent=2))
    else:
        print("\n".join(model.summary_lines(run)))
    return EXIT_INTERRUPTED if stopped else 0


def _coverage(args: argparse.Namespace) -> int:
    from tuner.answers.covered import coverage, table

    found = coverage(args.family, db=args.db)
    if args.json:
        print(json.dumps(report.plain(found), indent=2))
        return 0
    print("\n".join(table(found)))
    return 0


def _best(args: argparse.Namespace) -> int:
    if not args.validate and (args.replay or args.ray_address):
        raise UsageError("--replay and --ray-address go with --validate")
    winner = api.best(args.family, args.shape, args.dtype, args.flags, db=args.db, device=args.device)
    if args.validate and isinstance(winner, api.Derived):
        result = api.validate(args.family, args.shape, args.dtype, args.flags, db=args.db,
                              device=args.device, ray_address=args.ray_address, replay=args.replay)
        if result is not None and result.status == "interrupted":
            print("tuner: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(f"validated: measured on {result.device if result else '-'} in study "
              f"{result.study if result else '-'}", file=sys.stderr)
        winner = api.best(args.family, args.shape, args.dtype, args.flags, db=args.db,
                          device=result.device if result else args.device, derive=False)
    if args.json:
        print(json.dumps(report.best_document(winner), indent=2))
        return 0
    if isinstance(winner, api.Derived):
        return _derived(args, winner)
    rows = [
        ("config", format_params(winner.params)),
        ("median", report.with_interval(winner.median_ms, winner.interval_ms)
         + (" re-timed" if winner.retime else "") + report.spread(winner)),
        *([("re-timed", report.retime_text(winner))] if winner.retime else []),
        *([("tie", report.tie_text(winner.retime))] if winner.retime and report.tie_text(winner.retime) else []),
        ("TFLOPS", f"{winner.tflops:.1f}" if winner.tflops is not None else "-"),
        ("error", f"{winner.error:.3g}" if winner.error is not None else "-"),
        ("GPU", f"{winner.device.name} (driver {winner.device.driver_version})"),
        ("toolkit", f"{winner.toolkit or '-'} (CUDA {winner.device.cuda_version})"),
        ("template", winner.template_hash),
        ("study", f"{winner.study}, trial {winner.trial_number}" + (" (replayed)" if winner.replayed else "")),
        ("when", report.when(winner.measured_at)),
    ]
    for label, value in rows:
        print(f"{label:<10}{value}")
    return 0


def _derived(args: argparse.Namespace, derived: Any) -> int:
    away = f", distance {derived.distance:.2f}" if derived.distance is not None else ""
    there = derived.source_best
    rows = [
        ("config", format_params(derived.params)),
        ("measured", "no: not measured for this shape (--validate measures it)"),
        ("source", f"{derived.source}{away}"),
    ]
    if there is not None:
        rows += [("there", f"{report.best_line(there)} on {there.device.name}"),
                 ("template", there.template_hash)]
    rows += [("rule", derived.rule)]
    rows += [("passed", line) for line in derived.passed_over]
    for label, value in rows:
        print(f"{label:<10}{value}")
    return 0


def _export(args: argparse.Namespace) -> int:
    path = api.export(args.family, args.shape, args.dtype, args.flags, out_dir=args.out,
                      db=args.db, device=args.device)
    print(f"wrote {path} and {launch_path(path)}")
    return 0


def _studies(args: argparse.Namespace) -> int:
    found = api.studies(db=args.db)
    if args.json:
        print(json.dumps([report.plain(s) for s in found], indent=2))
        return 0
    if not found:
        print("no studies stored")
    for s in found:
        best = f"{s.best_median_ms:.4f} ms" if s.best_median_ms is not None else "-"
        print(f"{s.name}  {s.status:<11} {s.sampler:<6} {s.n_ok} ok / {s.n_failed} failed  "
              f"best {best}  {report.when(s.updated_at)}")
    return 0


def _show(args: argparse.Namespace) -> int:
    detail = api.show(args.study, db=args.db)
    if args.optuna:
        api.export_optuna(args.study, args.optuna, db=args.db)
        print(f"copied to {args.optuna} (optuna-dashboard {args.optuna})", file=sys.stderr)
    if args.json:
        print(json.dumps({"study": report.plain(detail.summary),
                          "trials": [report.plain(t) for t in detail.trials]}, indent=2))
        return 0
    s = detail.summary
    print(f"{s.name}: {s.status}, {s.sampler} sampler, {s.n_trials} trials "
          f"({s.n_ok} ok, {s.n_failed} failed) on {s.device_name}")
    retimed = {r.trial_number: r for r in detail.retimes}
    gpus = sorted({t.gpu_index for t in detail.trials if t.gpu_index is not None})
    if len(gpus) > 1:
        where = (detail.retimes[0].gpu_state or {}).get("gpu") if detail.retimes else None
        print(f"  measured on GPUs {', '.join(map(str, gpus))}; normalized to GPU "
              f"{gpus[0] if where is None else where.get('index')}, the re-timing's")
    for t in detail.trials:
        result = f"{t.median_ms:.4f} ms" if t.status == "ok" else f"{t.failure}: {t.reason}"
        if t.status == "ok" and t.interval_ms is not None:
            result += f" +-{100 * t.interval_ms / t.ranked_ms:.1f}%"
        gpu = report.trial_gpu_text(t)
        if gpu:
            result += f" [{gpu}]"
        if t.number in retimed:
            r = retimed[t.number]
            result += (f" | re-timed {r.median_ms:.4f} ms, IQR {report.ms(r.iqr_ms)} (rank {r.rank})" if r.ok
                       else f" | re-timing failed ({r.failure}: {r.reason})")
        print(f"  #{t.number:<5} {result}  {format_params(t.params)}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.shape is not None and args.dtype is None:
        raise UsageError("--shape needs --dtype")
    if args.shape is None and args.flags:
        raise UsageError("problem flags need --shape")
    if args.shapes is not None and args.shape is not None:
        raise UsageError("--shape and --shapes: give one")
    if args.shapes is not None:
        from tuner.lookup import family
        from tuner.study.many import read_problems

        listed = read_problems(family(args.family), args.shapes)
        problems = [(p.shape, p.dtype, dict(p.flags)) for p in listed if args.dtype in (None, p.dtype)] or None
    elif args.shape is not None:
        problems = [(args.shape, args.dtype, args.flags)]
    else:  # the family's suite, or its problems of one dtype
        problems = [p for p in suite_of(args.family) if args.dtype in (None, p[1])] or None
    rows = run_bench(args.family, problems, db=args.db, tune_trials=args.tune)
    if args.json:
        print(json.dumps([report.plain(row) for row in rows], indent=2))
        return 0
    print("\n".join(report.bench_table(rows)))
    return 0


def _bench_search(args: argparse.Namespace) -> int:
    if args.png:
        check_plot(args.png)  # before the runs, which take minutes
    report = bench_search(args.landscapes, seeds=args.seeds, samplers=args.samplers,
                          progress=logging.getLogger("tuner").info, family=args.family,
                          in_flight=args.in_flight)
    if args.png:
        plot_search(report, args.png)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    print(f"{len(report.landscapes)} landscape(s), {report.seeds} seeds each, "
          f"{report.space_size} valid configs (median); measured trials to come within 2% / 5% of the best")
    print("| sampler | runs | median 2% | p90 2% | median 5% | p90 5% | median to a tie | p90 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, result in report.samplers.items():
        s = result.stats()
        print(f"| {name} | {s['runs']} | {s['median_trials_2pct']:g} | {s['p90_trials_2pct']:g} | "
              f"{s['median_trials_5pct']:g} | {s['p90_trials_5pct']:g} | {s['median_trials_tie']:g} | "
              f"{s['p90_trials_tie']:g} |")
    print("(a tie: a config within the intervals of the best's, as the landscape recorded them)")
    names = list(report.samplers)
    print("\nmedian trials to 2%, per landscape")
    print("| landscape | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for land in report.landscapes:
        cells = [report.samplers[n].stats()["median_trials_2pct_by_landscape"].get(land) for n in names]
        print(f"| {land} | " + " | ".join("-" if c is None else f"{c:g}" for c in cells) + " |")
    for name, why in report.not_applicable.items():
        print(f"{name}: not run: {why}")
    return 0


SERVE_EXTRA = ("tuner serve needs FastAPI and uvicorn: pip install 'kernel-tuner-service[serve]'")


def _serve(args: argparse.Namespace) -> int:
    try:
        from tuner.answers.serve import serve
    except ImportError as error:
        raise UsageError(f"{SERVE_EXTRA} ({error})") from None
    jobs = None
    if args.run_jobs:
        from tuner.jobs.scheduler import SchedulerOptions

        jobs = SchedulerOptions(replay=tuple(args.replay or ()), slice_trials=args.slice_trials,
                                pool=_pool_options(args, replay=None))
        if args.simulate_gpus and not args.replay:
            raise UsageError("--simulate-gpus needs --replay")
    elif args.replay or args.ray_address or args.simulate_gpus:
        raise UsageError("--replay, --simulate-gpus and --ray-address are options of --run-jobs")
    serve(args.db, host=args.host, port=args.port, jobs=jobs)
    return 0


def _report(args: argparse.Namespace) -> int:
    if args.package is not None:
        if args.study is not None or args.out is not None:
            raise UsageError("report: --package DIR takes no STUDY and no -o")
        from tuner.answers.guard import read_table
        from tuner.reports.package_table import document, markdown

        table = read_table(args.package)
        print(json.dumps(document(table), indent=2) if args.json else "\n".join(markdown(table)))
        return 0
    if args.study is None or args.out is None or args.json:
        raise UsageError("report: give STUDY and -o FILE (a PNG), or --package DIR [--json]")
    print(f"wrote {plot_study(args.study, args.out, db=args.db)}")
    return 0


def _landscape(args: argparse.Namespace) -> int:
    path = record_landscape(args.study, args.out, db=args.db)
    print(f"wrote {path}")
    return 0


_COMMANDS = {"tune": _tune, "tune-many": _tune_many, "tune-model": _tune_model,
             "coverage": _coverage, "best": _best, "export": _export, "studies": _studies, "show": _show,
             "landscape": _landscape, "serve": _serve, "bench": _bench, "bench-search": _bench_search,
             "check": check.run, "export-dispatch": export_dispatch.run,
             "export-torch": export_torch.run, "guard": guard.run, "report": _report,
             "lint": lint.run, **{name: job_commands.run for name in job_commands.COMMANDS}}


# -- helpers ---------------------------------------------------------------------------------------
def _stdout_to_devnull() -> None:
    """After a closed pipe: what is left in stdout's buffer goes nowhere, so that Python's last
    flush at exit does not fail again (and print a traceback)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _setup_logging(verbose: bool) -> None:
    """Our progress on stderr; the workers' and storage's warnings too (everything with -v)."""
    levels = {"tuner": logging.INFO, "workers": logging.WARNING, "storage": logging.WARNING}
    log_to_stderr({name: logging.DEBUG if verbose else level for name, level in levels.items()})
