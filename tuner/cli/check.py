"""``tuner check``: the command line of :func:`tuner.answers.sanitize.check`, kept beside ``tuner/cli/commands.py``
(which only adds it to its commands)::

    tuner check STUDY [--tools memcheck,racecheck,synccheck] [--trial N] [--family REF] [--json]
    tuner check --all-winners

Prints a row per config and tool (errors, kinds of finding, what the runner said), the first
lines of each tool's first finding under the table; exits 1 when a tool found errors (or could
not finish, or the config did not compile), 0 when every tool came back clean, 2 on bad input,
without compute-sanitizer or without a GPU.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tuner.answers.sanitize import TOOLS, CheckResult, check
from tuner.cli.text import plain
from tuner.study.progress import format_params

EXIT_FOUND = 1


def tool_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TOOLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown tool {unknown[0] if unknown else text!r} (choose from {', '.join(TOOLS)}, comma-separated)")
    return names


def add_parser(sub: Any, common: argparse.ArgumentParser, seconds: Any) -> None:
    """The ``check`` subcommand, on the CLI's subparsers (``common``: --db and -v)."""
    parser = sub.add_parser("check", parents=[common],
                            help="run compute-sanitizer (memcheck, racecheck, synccheck) on stored winners")
    parser.add_argument("study", metavar="STUDY", nargs="?", help="study name or id (see `tuner studies`)")
    parser.add_argument("--tools", type=tool_list, default=list(TOOLS), metavar="LIST",
                        help=f"comma-separated, of {','.join(TOOLS)} (default: all three)")
    parser.add_argument("--trial", type=int, metavar="N", help="the study's trial N instead of its winner")
    parser.add_argument("--all-winners", action="store_true", help="every stored best instead of one study's")
    parser.add_argument("--family", metavar="REF",
                        help="the study's family where it is not installed (a path or module:ATTR)")
    parser.add_argument("--timeout", type=seconds, default=300.0, metavar="SECONDS",
                        help="a tool's run longer than this is killed (default 300)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    results = check(args.study, tools=args.tools, trial=args.trial, all_winners=args.all_winners,
                    family=args.family, db=args.db, timeout_s=args.timeout)
    code = 0 if all(r.clean for r in results) else EXIT_FOUND
    if args.json:
        print(json.dumps([{**plain(r), "clean": r.clean,
                           "reports": [{**plain(t), "clean": t.clean} for t in r.reports]} for r in results],
                         indent=2))
        return code
    print("\n".join(table(results)))
    return code


def table(results: list[CheckResult]) -> list[str]:
    """Markdown rows (config, tool, errors, kinds, the runner's outcome, seconds), then each
    tool's first finding and the configs not run."""
    lines = ["| config | tool | errors | kinds | run | s |", "|---|---|---|---|---|---|"]
    after: list[str] = []
    for r in results:
        name = f"{r.family} {r.problem} #{r.trial_number}"
        if r.note:
            lines.append(f"| {name} | - | - | - | {r.note} | - |")
            continue
        for t in r.reports:
            errors = str(t.errors) if t.complete else f"{t.errors}?"
            kinds = ", ".join(f"{k} ({n})" for k, n in t.kinds.items()) or "-"
            lines.append(f"| {name} | {t.tool} | {errors} | {kinds} | {t.outcome} | {t.seconds:.1f} |")
            if t.first:
                after += [f"{t.tool} on {name}, first finding:", *(f"    {line}" for line in t.first)]
            if not t.complete:
                after.append(f"{t.tool} on {name}: no summary from the tool (it did not finish)"
                             + "".join(f"; {note}" for note in t.notes[-2:]))
    for r in results:
        if r.template_changed:
            after.append(f"{r.family} {r.problem} #{r.trial_number}: measured with another template "
                         "version; the current one was checked")
    found = sum(not r.clean for r in results)
    after.append(f"{len(results)} config(s) checked: "
                 + ("clean" if not found else f"{found} with findings"))
    lines.append("")
    for r in results:
        lines.append(f"#{r.trial_number} of {r.study}: {format_params(r.params)}")
    return lines + after
