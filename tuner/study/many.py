"""Many problems of one family tuned in a row, from a list in a YAML file.

    results = tuner.tune_many("attention", "shapes.yaml", trials=50)
    for done in results:
        print(done.problem, done.result.status, done.result.best.median_ms)

The file lists problems, each a shape, a dtype and the family's flags::

    - {shape: "2,8,1024,64", dtype: fp16, flags: {causal: true}}
    - shape: [4, 8, 512, 64]
      dtype: fp16
      flags: {causal: true}

Each problem gets the whole budget (``trials`` measured trials of its study, or ``time_budget``
seconds) and is tuned in the file's order, so that each warm-starts from the winners of those
tuned before it (:mod:`tuner.study.warmstart`). Run again, the same call resumes: a problem whose study
is at its budget (``trials`` measured; with a time budget, a study that finished) is skipped,
the one that was interrupted goes on, the rest follow. One Ray serves every problem, and one
worker pool every problem of a family in a row (:mod:`tuner.study.shared_run`).
:func:`tune_list` runs such a list of problems of several families (``tuner tune-model``'s).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from templates.family import KernelFamily, Problem
from tuner import api, database, lookup
from tuner.errors import UsageError, first_line
from tuner.study.options import StudyOptions, split_keywords
from tuner.study.progress import format_params
from tuner.study.shared_run import SharedRun
from workers.pool_options import PoolOptions

logger = logging.getLogger("tuner")

ENTRY_KEYS = ("shape", "dtype", "flags")


@dataclass(frozen=True)
class Tuned:
    """One problem of :func:`tune_many`: its key, what its call did (None: not reached) and its
    family's name."""

    problem: str
    result: api.TuneResult | None
    family: str = ""


def read_problems(fam: KernelFamily, path: str | Path) -> list[Problem]:
    """The problems a YAML file lists (each refused in one line naming its entry)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        byte = error.object[error.start]
        raise UsageError(f"{path} is not UTF-8 text: byte 0x{byte:02x} at offset {error.start}") from None
    try:
        entries = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UsageError(f"{path} is not YAML: {first_line(error)}") from None
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path}: expected a list of problems, each with shape, dtype and flags")
    problems: list[Problem] = []
    for number, entry in enumerate(entries, start=1):
        problems.append(_entry(fam, entry, f"{path}: entry {number}"))
    return problems


def _entry(fam: KernelFamily, entry: Any, where: str) -> Problem:
    if not isinstance(entry, Mapping):
        raise UsageError(f"{where} is not a mapping of shape, dtype and flags")
    unknown = sorted(str(key) for key in entry if key not in ENTRY_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(ENTRY_KEYS)})")
    for key in ("shape", "dtype"):
        if entry.get(key) is None:
            raise UsageError(f"{where} has no {key!r}")
    flags = entry.get("flags") or {}
    if not isinstance(flags, Mapping):
        raise UsageError(f"{where}: flags must be a mapping (name: value), not {flags!r}")
    shape = entry["shape"]
    if isinstance(shape, list):
        shape = ",".join(str(d) for d in shape)
    try:
        return lookup.problem(fam, str(shape), str(entry["dtype"]), dict(flags))
    except UsageError as error:
        raise UsageError(f"{where}: {error}") from None


def landscapes_for(fam: KernelFamily, problems: Sequence[Problem],
                   replay: Sequence[str | Path]) -> dict[Problem, Path]:
    """For each problem, the landscape among ``replay`` (files, folders of them, or the names of
    those the family ships) that records it; UsageError naming a problem none records."""
    found = recorded_landscapes(fam, replay)
    missing = [p for p in problems if p not in found]
    if missing:
        raise UsageError(f"no landscape given records {fam.name} {missing[0].key} "
                         f"(--replay: one landscape per problem, or a folder of them)")
    return {p: found[p] for p in problems}


def recorded_landscapes(fam: KernelFamily, replay: Sequence[str | Path], *,
                        others: bool = False) -> dict[Problem, Path]:
    """The problems of ``fam`` that the landscapes among ``replay`` record, each with the first
    that does; UsageError naming a path that is neither a file nor a folder, or a landscape of
    another family (passed over with ``others``: a model's landscapes of several families)."""
    from workers.replay import landscape_json  # here: importing tuner loads no Ray

    files: list[Path] = []
    for given in replay:
        try:
            path = Path(api.landscape_file(fam, given) or given)
        except UsageError:
            if others:
                continue
            raise
        if path.is_dir():
            files += sorted([*path.glob("*.json"), *path.glob("*.json.gz")])
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"cannot read landscape {given}: No such file or directory")
    found: dict[Problem, Path] = {}
    for path in files:
        try:
            data = landscape_json(path)
            recorded = Problem.from_json(data["problem"]) if data.get("family") == fam.name else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a landscape: the folder may hold other files
        if recorded is not None:
            found.setdefault(recorded, path)
    return found


def tune_many(
    family: str | KernelFamily,
    problems: str | Path | Sequence[Problem],
    *,
    db: str | None = None,
    replay: Sequence[str | Path] | None = None,
    options: StudyOptions | None = None,
    pool: PoolOptions | None = None,
    **keywords: Any,
) -> list[Tuned]:
    """Tune each problem (a YAML file of them, or Problems) with the budget of :func:`tune`
    each, in order (``options``, ``pool`` and their keywords as :func:`tuner.tune` takes them); a
    problem at its budget already is skipped. ``replay``: landscapes (files or folders) of which
    one records each problem. Ctrl-C stops after the problem being tuned (its study keeps what
    finished); the problems not reached are in the list with ``result=None``."""
    study, where = split_keywords("tune_many", keywords, options, pool)
    fam = lookup.family(family)
    wanted = read_problems(fam, problems) if isinstance(problems, (str, Path)) else list(problems)
    wanted = list(dict.fromkeys(wanted))  # each once, in order
    api.check_budget(study, where)
    landscapes = landscapes_for(fam, wanted, replay) if replay else {}
    return tune_list([(fam, p) for p in wanted], db=db, landscapes=landscapes, options=study, pool=where)


def tune_list(
    problems: Sequence[tuple[KernelFamily, Problem]],
    *,
    db: str | None,
    landscapes: Mapping[Problem, Path],
    options: StudyOptions,
    pool: PoolOptions,
) -> list[Tuned]:
    """:func:`tune_many`'s run once its arguments are checked (``api.check_budget``): each
    (family, problem) in order, of one family or several, in one Ray; ``landscapes``: the
    replay of each problem (all or none)."""
    study, where = options, pool
    if not problems:
        return []
    if study.trials is None and study.time_budget is None:
        study = replace(study, trials=api.DEFAULT_TRIALS)
    study = replace(study, skip_at_budget=True)
    url = database.url(db)
    database.check(url)  # a database that cannot be opened: refused before Ray starts
    done: list[Tuned] = []
    mixed = len({fam.name for fam, _ in problems}) > 1
    first_replay = next(iter(landscapes.values()), None)
    with api.quiet_optuna(), api.ray_for(where.ray_address, first_replay, family=problems[0][0]), \
            SharedRun() as shared:
        for number, (fam, problem) in enumerate(problems, start=1):
            head = f"problem {number}/{len(problems)} {fam.name + ' ' if mixed else ''}{problem.key}"
            logger.info("%s", head)
            landscape = landscapes.get(problem)
            result = api.tune_here(fam, problem, url, replace(study, replay=landscape),
                                   replace(where, replay=landscape), shared=shared)
            done.append(Tuned(problem.key, result, fam.name))
            logger.info("%s: %s (%s); best %s", head, result.status, result.reason, _best_text(result))
            if result.status == "interrupted":
                break
    done += [Tuned(p.key, None, fam.name) for fam, p in problems[len(done):]]
    tuned = [d for d in done if d.result is not None and d.result.best is not None]
    logger.info("%d of %d problems have a validated best", len(tuned), len(problems))
    return done


def _best_text(result: api.TuneResult) -> str:
    best = result.best
    if best is None:
        return "none validated yet"
    tflops = f", {best.tflops:.1f} TFLOPS" if best.tflops is not None else ""
    return f"{best.median_ms:.4f} ms{tflops} {format_params(best.params)}"
