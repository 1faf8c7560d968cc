"""``tuner submit``, ``tuner jobs``, ``tuner cancel`` and ``tuner token``: the command line of
:mod:`tuner.jobs.client` and :mod:`tuner.jobs.tokens`, kept beside ``tuner/cli/commands.py`` (which
only adds them to its commands)::

    tuner token create --scope write --db sqlite:///tuner.db    # prints the token, once
    export TUNER_SERVER=http://gpu-box:8765 TUNER_TOKEN=tkn_...
    tuner submit attention --shape 2,8,1024,64 --dtype fp16 --causal --trials 50 --priority 1
    tuner submit attention --problems shapes.yaml --trials 50
    tuner jobs [ID] [--json]
    tuner cancel ID
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuner.errors import UsageError, first_line
from tuner.jobs import client
from tuner.jobs.tokens import SCOPES, create_token

COMMANDS = ("submit", "jobs", "cancel", "token")


def add_parsers(sub: Any, common: argparse.ArgumentParser, whole: Any) -> None:
    """The job commands on the CLI's subparsers (``common``: --db and -v; ``whole``: the
    argument type of a whole number of at least 1)."""
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--server", metavar="URL",
                        help=f"the server (default: $TUNER_SERVER or {client.DEFAULT_SERVER})")
    server.add_argument("--token", metavar="TOKEN", help="its token (default: $TUNER_TOKEN)")
    server.add_argument("--json", action="store_true", help="print JSON")

    submit = sub.add_parser("submit", parents=[server], help="queue a job on a server: problems of a family, a budget each")
    submit.add_argument("family", help="kernel family, e.g. attention")
    submit.add_argument("--shape", help="one problem's shape, e.g. 2,8,1024,64; then the family's flags, e.g. --causal")
    submit.add_argument("--dtype", help="its element type, e.g. fp16")
    submit.add_argument("--problems", metavar="FILE",
                        help="YAML: a list of problems, each {shape: 2,8,1024,64, dtype: fp16, flags: {...}}")
    submit.add_argument("--trials", type=whole, required=True, metavar="N", help="each problem's study to N trials")
    submit.add_argument("--priority", type=int, default=0, metavar="P", help="higher runs first (default 0)")
    submit.add_argument("--sampler", help="tpe (default), optuna-tpe, random or grid")
    submit.add_argument("--seed", type=int, metavar="N", help="sampler seed")

    listing = sub.add_parser("jobs", parents=[server], help="the jobs on a server: state, progress, best so far, ETA")
    listing.add_argument("job", type=int, nargs="?", metavar="ID", help="one job, with its problems")

    cancel = sub.add_parser("cancel", parents=[server], help="cancel a job on a server (its trials stay stored)")
    cancel.add_argument("job", type=int, metavar="ID", help="the job's id (see `tuner jobs`)")

    token = sub.add_parser("token", parents=[common], help="make a token for `tuner serve` (printed once)")
    token.add_argument("action", choices=("create",), help="create: a new token")
    token.add_argument("--scope", choices=SCOPES, required=True, help="read, or write (submit and cancel; reads too)")
    token.add_argument("--label", help="what it is for, kept beside it")


def run(args: argparse.Namespace) -> int:
    if args.command == "token":
        print(create_token(args.db, args.scope, args.label))
        return 0
    if args.command == "submit":
        shown = client.submit(args.server, _job(args), args.token)
    elif args.command == "cancel":
        shown = client.cancel(args.server, args.job, args.token)
    elif args.job is not None:
        shown = client.job(args.server, args.job, args.token)
    else:
        found = client.jobs(args.server, args.token)
        print(json.dumps(found, indent=2) if args.json else "\n".join(_line(j) for j in found) or "no jobs")
        return 0
    print(json.dumps(shown, indent=2) if args.json else _detail(shown))
    return 0


def _job(args: argparse.Namespace) -> dict[str, Any]:
    """The body of ``POST /jobs``, as given: the server checks it."""
    if (args.problems is None) == (args.shape is None):
        raise UsageError("give one problem (--shape, --dtype and the family's flags) or --problems FILE")
    if args.problems is not None:
        problems = _read(args.problems)
    else:
        if args.dtype is None:
            raise UsageError("--shape needs --dtype")
        problems = [{"shape": args.shape, "dtype": args.dtype, "flags": args.flags or {}}]
    body: dict[str, Any] = {"family": args.family, "problems": problems, "trials": args.trials,
                            "priority": args.priority}
    if args.sampler is not None:
        body["sampler"] = args.sampler
    if args.seed is not None:
        body["seed"] = args.seed
    return body


def _read(path: str) -> list[Any]:
    import yaml

    try:
        entries = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UsageError(f"cannot read {path}: {first_line(error)}") from None
    if not isinstance(entries, list):
        raise UsageError(f"{path}: expected a list of problems, each with shape, dtype and flags")
    return [{**e, "shape": ",".join(str(d) for d in e["shape"])} if isinstance(e, dict) and isinstance(e.get("shape"), list)
            else e for e in entries]


def _line(job: dict[str, Any]) -> str:
    best = f"best {job['best_median_ms']:.4f} ms" if job.get("best_median_ms") is not None else "no best yet"
    eta = f", ETA {job['eta_s']:.0f}s" if job.get("eta_s") and job["state"] in ("queued", "running") else ""
    return (f"{job['id']:>4}  {job['state']:<9}  priority {job['priority']:<4} {job['family']:<12} "
            f"{job['measured']}/{job['budget']} trials, {len(job['problems'])} problem(s), {best}{eta}")


def _detail(job: dict[str, Any]) -> str:
    lines = [_line(job)] + ([f"      {job['reason']}"] if job.get("reason") else [])
    for p in job["problems"]:
        shape = "x".join(str(d) for d in p["shape"])
        flags = "".join(f"-{k}" if v is True else f"-{k}={v}" for k, v in sorted(p["flags"].items()) if v is not False)
        best = f", best {p['best_median_ms']:.4f} ms" if p.get("best_median_ms") is not None else ""
        lines.append(f"      {shape}-{p['dtype']}{flags}: {p['state']}, {p['measured']}/{job['trials']} trials{best}")
    return "\n".join(lines)
