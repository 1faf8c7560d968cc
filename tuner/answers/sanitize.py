"""compute-sanitizer on stored winners: ``tuner check STUDY`` runs memcheck, racecheck and
synccheck on the study's winner (or one of its trials, or every stored best) and says what they
found::

    results = tuner.check("attention/2x8x1024x64-fp16-causal/NVIDIA-H200/3f9a0c1d2e4b5a6c")
    for result in results:
        for report in result.reports:
            print(report.tool, report.errors, report.kinds, report.first)

Each tool runs ``python -m workers.sanitize_run`` under ``compute-sanitizer --tool X``: the config
compiled, loaded and run on the family's inputs through the workers' own cuda-python path, and
checked as a trial is (``workers.sanitizer``). Without compute-sanitizer (on PATH, beside nvcc or
in /usr/local/cuda/bin) or without a GPU: one :class:`tuner.TunerError` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tuner import database, lookup
from tuner.errors import NoGPU, NotFound, TunerError, UsageError, first_line

TOOLS = ("memcheck", "racecheck", "synccheck")  # workers.sanitizer.TOOLS, without importing it here
NO_SANITIZER = ("compute-sanitizer not found (on PATH, beside nvcc, or in /usr/local/cuda/bin): "
                "it comes with the CUDA toolkit")
NO_GPU = "no GPU is visible: compute-sanitizer runs the kernels on one"


class NoSanitizer(TunerError):
    """compute-sanitizer is not installed where the tuner looks for it."""


@dataclass(frozen=True)
class CheckResult:
    """One config checked: where it comes from, and what each tool found (``reports``:
    ``workers.sanitizer.SanitizerReport``), or why it was not run (``note``)."""

    study: str
    trial_number: int
    family: str
    problem: str  # the problem's key
    params: dict[str, Any]
    reports: tuple[Any, ...] = ()
    note: str = ""  # the config did not compile, or its family does not load here
    template_changed: bool = False  # measured with another template version than the current one

    @property
    def clean(self) -> bool:
        return not self.note and all(report.clean for report in self.reports)


@dataclass(frozen=True)
class _Target:
    study: str
    trial_number: int
    family: str
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]
    params: dict[str, Any]
    template_hash: str


def check(study: str | None = None, *, tools: Sequence[str] = TOOLS, trial: int | None = None,
          all_winners: bool = False, family: str | None = None, db: str | None = None,
          timeout_s: float = 300.0) -> list[CheckResult]:
    """Run ``tools`` on the winner of ``study`` (its stored best, else its fastest ok trial), on
    its trial number ``trial`` (any status), or with ``all_winners`` on every stored best.
    ``family``: the family where it is not installed (a path or module:ATTR)."""
    tools = _tools(tools)
    if (study is None) == (not all_winners):
        raise UsageError("give a STUDY or --all-winners")
    if trial is not None and study is None:
        raise UsageError("--trial goes with a STUDY")
    if not 0 < timeout_s < float("inf"):
        raise UsageError(f"the timeout must be a positive number of seconds, not {timeout_s:g}")
    with database.repository(database.url(db), create=False) as repo:
        targets = _all_winners(repo) if all_winners else [_of_study(repo, study, trial)]  # type: ignore[arg-type]
    from workers.driver import gpu_count
    from workers.sanitizer import find_sanitizer

    sanitizer = find_sanitizer()
    if sanitizer is None:
        raise NoSanitizer(NO_SANITIZER)
    if gpu_count() == 0:
        raise NoGPU(NO_GPU)
    return [_check_one(target, tools, sanitizer, family, timeout_s, strict=not all_winners) for target in targets]


def _tools(tools: Sequence[str] | str) -> tuple[str, ...]:
    names = [t.strip() for t in (tools.split(",") if isinstance(tools, str) else tools) if t.strip()]
    unknown = [t for t in names if t not in TOOLS]
    if unknown or not names:
        raise UsageError(f"unknown sanitizer tool {unknown[0] if unknown else ''!r} (choose from {', '.join(TOOLS)})")
    return tuple(dict.fromkeys(names))


def _find_study(repo: Any, name: str) -> Any:
    stored = database.call(repo.studies)
    found = [s for s in stored if s.name == name] or [s for s in stored if str(s.id) == name.strip()]
    if not found:
        raise NotFound(f"no study named {name!r} (see `tuner studies`)")
    return found[0]


def _of_study(repo: Any, name: str, number: int | None) -> _Target:
    summary = _find_study(repo, name)
    trials = database.call(lambda: repo.trials(summary.id))
    base = dict(study=summary.name, family=summary.family, shape=tuple(summary.shape), dtype=summary.dtype,
                flags=dict(summary.flags), template_hash=summary.template_hash)
    if number is not None:
        picked = next((t for t in trials if t.number == number), None)
        if picked is None:
            raise NotFound(f"study {summary.name!r} has no trial {number}")
        return _Target(trial_number=number, params=dict(picked.params), **base)
    winner = database.call(lambda: repo.best(summary.family, summary.shape, summary.dtype, summary.flags,
                                             device_name=summary.device_name,
                                             template_hash=summary.template_hash))
    if winner is not None and winner.study == summary.name:
        return _Target(trial_number=winner.trial_number, params=dict(winner.params), **base)
    ok = [t for t in trials if t.status == "ok" and t.median_ms is not None]
    if not ok:
        raise NotFound(f"study {summary.name!r} has no validated trial to check")
    fastest = min(ok, key=lambda t: t.ranked_ms)
    return _Target(trial_number=fastest.number, params=dict(fastest.params), **base)


def _all_winners(repo: Any) -> list[_Target]:
    families = sorted({s.family for s in database.call(repo.studies)})
    bests = [b for name in families for b in database.call(lambda: repo.bests(name))]
    if not bests:
        raise NotFound("no validated result stored; run `tuner tune` first")
    return [_Target(b.study, b.trial_number, b.family, tuple(b.shape), b.dtype, dict(b.flags), dict(b.params),
                    b.template_hash) for b in bests]


def _check_one(target: _Target, tools: Sequence[str], sanitizer: str, family_ref: str | None,
               timeout_s: float, *, strict: bool) -> CheckResult:
    """One target checked. ``strict``: a family that does not load here is a UsageError (else
    the result says so, and the other targets are checked)."""
    from templates import reference
    from workers.compile import compile_cubin, default_cache_dir
    from workers.errors import CompileError
    from workers.results import CompileRequest
    from workers.sanitizer import RunSpec, run_tool

    def result(problem_key: str, **extra: Any) -> CheckResult:
        return CheckResult(target.study, target.trial_number, target.family, problem_key, target.params, **extra)

    key = "x".join(map(str, target.shape)) + f"-{target.dtype}"
    try:
        fam = lookup.family(family_ref or target.family)
        if fam.name != target.family:
            raise UsageError(f"{family_ref} is the family {fam.name!r}, the study's is {target.family!r}")
        problem = lookup.problem(fam, target.shape, target.dtype, target.flags)
    except UsageError as error:
        why = f"cannot load the family {target.family!r}: {error}" + (
            "" if family_ref else " (give it by path or module:ATTR: --family)")
        if strict:
            raise UsageError(why) from None
        return result(key, note=why)
    ref = reference(fam)
    if not isinstance(ref, str):
        raise UsageError(f"the family {fam.name!r} is only registered in this process: "
                         "give it by path or module:ATTR (--family)")
    changed = fam.template_hash != target.template_hash
    params = fam.complete(target.params)
    try:
        launch = fam.launch(params, problem)
        compile_cubin(CompileRequest(fam.render(params, problem), launch.kernel,
                                     tuple(fam.compile_options(params, problem))), cache_dir=default_cache_dir())
    except (CompileError, ValueError) as error:
        return result(problem.key, note=f"does not compile: {first_line(error)}", template_changed=changed)
    spec = RunSpec(ref, problem.spec, params, cache_dir=str(default_cache_dir()))
    reports = tuple(run_tool(tool, spec, sanitizer=sanitizer, timeout_s=timeout_s) for tool in tools)
    return result(problem.key, reports=reports, template_changed=changed)


__all__ = ["CheckResult", "NoSanitizer", "TOOLS", "check"]
