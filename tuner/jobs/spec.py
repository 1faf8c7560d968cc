"""A submitted job, checked before anything is queued: an installed family, problems it takes,
a budget and a priority within bounds. Every refusal is one :class:`tuner.UsageError` line.

    job = check_job({"family": "attention", "trials": 50, "priority": 1,
                     "problems": [{"shape": "2,8,1024,64", "dtype": "fp16", "flags": {"causal": True}}]})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tuner import lookup
from tuner.errors import UsageError
from tuner.study import search

MAX_PROBLEMS = 64  # problems in one job
MAX_TRIALS = 100_000  # each problem's budget
MAX_PRIORITY = 100  # priorities run from -MAX_PRIORITY to MAX_PRIORITY
MAX_BODY_BYTES = 64 * 1024  # a request's body
PROBLEM_KEYS = ("shape", "dtype", "flags")


@dataclass(frozen=True)
class CheckedJob:
    """A job that may be queued: its family's name, its problems as stored (shape, dtype,
    flags), each one's budget, its priority and how it searches."""

    family: str
    problems: tuple[tuple[tuple[int, ...], str, dict[str, Any]], ...]
    trials: int
    priority: int
    settings: dict[str, Any]


def check_job(body: Mapping[str, Any]) -> CheckedJob:
    """``body`` (the JSON of ``POST /jobs``) as a job, or one UsageError naming what is wrong."""
    from templates import families

    name = body.get("family")
    installed = tuple(families())
    if name not in installed:
        raise UsageError(f"unknown family {name!r} (installed: {', '.join(installed)})")
    fam = lookup.family(name)
    trials, priority = body.get("trials"), body.get("priority", 0)
    if not _whole(trials) or not 1 <= trials <= MAX_TRIALS:
        raise UsageError(f"trials must be a whole number from 1 to {MAX_TRIALS}, not {trials!r}")
    if not _whole(priority) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise UsageError(f"priority must be a whole number from {-MAX_PRIORITY} to {MAX_PRIORITY}, not {priority!r}")
    sampler = body.get("sampler") or "tpe"
    if sampler not in search.SAMPLERS:
        raise UsageError(f"unknown sampler {sampler!r} (choose from {', '.join(search.SAMPLERS)})")
    seed = body.get("seed")
    if seed is not None and not _whole(seed):
        raise UsageError(f"seed must be a whole number, not {seed!r}")
    problems = body.get("problems")
    if not isinstance(problems, list) or not 1 <= len(problems) <= MAX_PROBLEMS:
        raise UsageError(f"problems must be a list of 1 to {MAX_PROBLEMS} problems")
    checked = []
    for number, entry in enumerate(problems, start=1):
        if not isinstance(entry, Mapping):
            raise UsageError(f"problem {number} is not an object with shape, dtype and flags")
        unknown = sorted(str(key) for key in entry if key not in PROBLEM_KEYS)
        if unknown:
            raise UsageError(f"problem {number}: unknown key {unknown[0]!r} (keys: {', '.join(PROBLEM_KEYS)})")
        try:
            problem = lookup.problem(fam, entry.get("shape"), entry.get("dtype"), entry.get("flags") or {})
        except (UsageError, TypeError, ValueError, AttributeError) as error:
            raise UsageError(f"problem {number}: {error}") from None
        spec = (tuple(problem.shape), problem.dtype, dict(problem.flags))
        if spec not in checked:
            checked.append(spec)
    return CheckedJob(fam.name, tuple(checked), trials, priority, {"sampler": sampler, "seed": seed})


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
