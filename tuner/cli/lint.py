"""``tuner lint FAMILY``: the command line of :func:`tuner.reports.lint.lint_family`, kept beside
``tuner/cli.py`` (which only adds it to its commands)::

    tuner lint docs/examples/rmsnorm
    tuner lint attention --shape 1,8,1024,64 --dtype fp16 --sample 4

Prints the space of each suite problem, the rendered and compiled configs and the reference's
CPU run; a broken family is one line ``tuner: error: FILE: FIELD: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from tuner.reports.lint import LintReport, lint_family


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("lint", parents=[common], help="check a family without a GPU: space, render, compile, reference")
    parser.add_argument("family", help="kernel family: a name, a folder or a .py file")
    parser.add_argument("--shape", help="the problem to render and compile (default: the suite's first)")
    parser.add_argument("--dtype", help="its element type")
    parser.add_argument("--sample", type=int, default=8, metavar="N", help="configs to compile (default 8)")
    parser.add_argument("--compiler", choices=("auto", "nvcc", "nvrtc"), default="auto",
                        help="the workers' compiler (default: auto)")


def run(args: argparse.Namespace) -> int:
    report = lint_family(args.family, shape=args.shape, dtype=args.dtype, sample=max(0, args.sample),
                         backend=args.compiler)
    print("\n".join(text(report)))
    return 0


def text(report: LintReport) -> list[str]:
    lines = [f"{report.family} ({report.file})", "space (limits of sm_90: H100, H200):"]
    for space in report.spaces:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(space.reasons.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {space.problem.key:<24} {space.valid:>7} of {space.total} valid "
                     f"({100 * space.valid / space.total:.0f}%)" + (f"; refused: {reasons}" if reasons else ""))
    lines.append(f"rendered: {report.rendered} valid configs of {report.problem.key} in {report.render_seconds:.1f} s, "
                 "each launch within the device's limits")
    if report.compiled:
        lines.append(f"compiled for sm_90a ({report.toolkit}):")
        lines.append(f"  {'seconds':>7} {'regs':>4} {'spills':>6} {'smem':>6}  config")
        for c in report.compiled:
            params = " ".join(f"{k}={v}" for k, v in c.params.items())
            note = f"  [screened: {c.screened}]" if c.screened else ""
            lines.append(f"  {c.seconds:7.2f} {c.registers!s:>4} {c.spill_bytes!s:>6} {c.smem_static!s:>6}  {params}{note}")
            lines.extend(f"          ptxas {advisory}" for advisory in c.advisories)
    lines.append(f"reference: {report.reference}")
    return lines
