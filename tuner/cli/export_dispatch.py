"""`tuner export-dispatch FAMILY -o DIR`: the family's tuned winners as one C++ header
(:func:`tuner.answers.dispatch.export_dispatch`); kept apart from tuner/cli/commands.py, which only registers it."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("export-dispatch", parents=[common],
                            help="write a C++ header dispatching every tuned problem of a family to its kernel")
    parser.add_argument("family", help="kernel family, e.g. attention")
    parser.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder")
    parser.add_argument("--device", metavar="GPU", help="the GPU whose winners it holds (needed when several are)")


def run(args: argparse.Namespace) -> int:
    from tuner.answers.dispatch import export_dispatch

    path = export_dispatch(args.family, out_dir=args.out, db=args.db, device=args.device)
    print(f"wrote {path} and {path.with_suffix('.json')}")
    return 0
