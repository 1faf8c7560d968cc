"""`tuner guard DIR`: a package of `tuner export-torch` timed against the vendor's path on its GPU,
each problem's ``use`` written back to its table (:func:`tuner.answers.guard.guard_package`);
kept apart from tuner/cli/commands.py, which only registers it."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable


def add_parser(sub: Any, common: argparse.ArgumentParser, positive_int: Callable[[str], int]) -> None:
    parser = sub.add_parser("guard", parents=[common],
                            help="time a torch package's kernels against the vendor's path on its GPU, and "
                                 "keep ours only where it wins")
    parser.add_argument("package", metavar="DIR", help="the package's folder (export-torch's OUT/NAME)")
    parser.add_argument("--reps", type=positive_int, default=100, metavar="N",
                        help="timed repetitions of each side, in turns (default 100)")
    parser.add_argument("--samples", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the any-shape rule's pick between tuned problems (default on)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from tuner.answers.guard import guard_package
    from tuner.reports.package_table import document, markdown

    table = guard_package(args.package, reps=args.reps, samples=args.samples)
    if args.json:
        print(json.dumps(document(table), indent=2))
        return 0
    print("\n".join(markdown(table)))
    print(f"\nwrote {args.package.rstrip('/')}/table.json")
    return 0
