"""`tuner export-torch FAMILY -o DIR`: the family's tuned winners as an importable Python package of
torch custom ops (:func:`tuner.answers.torch_export.export_torch`); kept apart from
tuner/cli/commands.py, which only registers it."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("export-torch", parents=[common],
                            help="write a Python package of torch custom ops running a family's tuned kernels")
    parser.add_argument("family", help="kernel family with a torch op, e.g. gemm")
    parser.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder (the package goes in it)")
    parser.add_argument("--device", metavar="GPU", help="the GPU whose winners it holds (needed when several are)")
    parser.add_argument("--name", help="the package's name and its ops' namespace (default tuned_FAMILY)")


def run(args: argparse.Namespace) -> int:
    from tuner.answers.torch_export import export_torch

    path = export_torch(args.family, out_dir=args.out, db=args.db, device=args.device, name=args.name)
    print(f"wrote {path} (import {path.name} with {path.parent} on sys.path)")
    return 0
