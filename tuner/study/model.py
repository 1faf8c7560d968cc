"""One transformer layer's kernels, from a Hugging Face ``config.json``, tuned as one list.

    from tuner.study import model

    shape = model.read_config("config.json")              # hidden, heads, KV heads, dtype, ...
    plan = model.plan_model(shape, tokens=(1, 64, 512))
    print(model.plan_yaml(plan))                          # the problems as tune-many YAML
    run = model.tune_model(plan, trials=20)               # tune-many's run over the whole list
    print("\\n".join(model.summary_lines(run)))

What a family computes of a layer is its ``layer_problems`` hook (the linear projections as
GEMMs, causal prefill of one sequence a token count); a problem a family cannot take (grouped-
query attention where the family has no KV heads, a shape it refuses) is listed as skipped, one
line each, and never tuned. The list is tuned by :func:`tuner.study.many.tune_list`: resumable
(a problem at its budget is skipped), progress over the whole list, each problem warm-started
from those before it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from templates.family import MODEL_DTYPES, KernelFamily, ModelShape, Problem, TemplateError
from tuner import api, lookup
from tuner.errors import UsageError
from tuner.study.many import Tuned, recorded_landscapes, tune_list
from tuner.study.options import StudyOptions, split_keywords
from workers.pool_options import PoolOptions

logger = logging.getLogger("tuner")

DEFAULT_TOKENS = tuple(2**i for i in range(14))  # 1, 2, 4, ..., 8192
DTYPES = MODEL_DTYPES  # a config's torch_dtype -> the families' name for it


@dataclass(frozen=True)
class Planned:
    """A problem to tune: its family's name, the problem, and the roles and token count it is for."""

    family: str
    problem: Problem
    roles: tuple[str, ...]
    tokens: int


@dataclass(frozen=True)
class Skipped:
    """A problem of the layer that is not tuned, and why (one line)."""

    family: str
    what: str
    role: str
    tokens: int
    reason: str

    @property
    def line(self) -> str:
        return f"skipped {self.family} {self.what} ({self.role}, {self.tokens} token{'' if self.tokens == 1 else 's'}): {self.reason}"


@dataclass(frozen=True)
class ModelPlan:
    """The problems of one layer of ``model`` at each token count, and those skipped."""

    model: ModelShape
    tokens: tuple[int, ...]
    problems: tuple[Planned, ...]
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True)
class ModelRun:
    """What :func:`tune_model` did: each planned problem's :class:`~tuner.study.many.Tuned` (in
    the plan's order), and what was skipped (the plan's, and with a replay those no landscape records)."""

    plan: ModelPlan
    done: tuple[Tuned, ...]
    skipped: tuple[Skipped, ...]


# -- the config -----------------------------------------------------------------------------------
def read_config(path: str | Path, *, dtype: str | None = None, lm_head: bool = False,
                gate_up: str = "fused") -> ModelShape:
    """The layer's sizes a ``config.json`` gives (:meth:`ModelShape.from_config`), or a UsageError
    naming the file and the field that is missing or wrong. ``dtype`` (fp16, bf16) replaces the
    config's ``torch_dtype``; ``lm_head`` lists the output head too (needs ``vocab_size``);
    ``gate_up``: "fused" or "separate"."""
    config = _load(path)
    try:
        return ModelShape.from_config(config, dtype=dtype, lm_head=lm_head, gate_up=gate_up)
    except TemplateError as error:
        raise UsageError(f"{path}: {error}") from None


def parse_tokens(text: str) -> tuple[int, ...]:
    """``"1,16,512"`` -> (1, 16, 512): token counts, each once, in the order given."""
    counts = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise UsageError(f"tokens: not a whole number: {part.strip()!r} (like 1,16,512)") from None
        if value < 1:
            raise UsageError(f"tokens: each count must be at least 1, not {value}")
        counts.append(value)
    return tuple(dict.fromkeys(counts))


def _load(path: str | Path) -> dict[str, Any]:
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:  # UnicodeDecodeError too
        raise UsageError(f"{path} is not a JSON config: {str(error).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} is not a JSON object of a model's config")
    return config


# -- the plan -------------------------------------------------------------------------------------
def plan_model(model: ModelShape, tokens: Sequence[int] = DEFAULT_TOKENS,
               families: Sequence[str | KernelFamily] | None = None) -> ModelPlan:
    """Each family's layer problems (``families``: the installed and registered, by default), a
    problem asked by several roles listed once, in the order first asked."""
    from templates import families as installed

    found: dict[tuple[str, Problem], Planned] = {}
    skipped: list[Skipped] = []
    for fam in _families(installed() if families is None else families):
        for entry in fam.layer_problems(model, tuple(tokens)):
            if entry.problem is None:
                skipped.append(Skipped(fam.name, entry.what, entry.role, entry.tokens, entry.skipped))
                continue
            key = (fam.name, entry.problem)
            before = found.get(key)
            roles = (*before.roles, entry.role) if before is not None else (entry.role,)
            found[key] = Planned(fam.name, entry.problem, tuple(dict.fromkeys(roles)), entry.tokens)
    return ModelPlan(model, tuple(tokens), tuple(found.values()), tuple(skipped))


def _families(refs: Sequence[str | KernelFamily]) -> list[KernelFamily]:
    found = []
    for ref in refs:
        try:
            found.append(lookup.family(ref))
        except UsageError as error:  # an installed plug-in that does not load computes nothing here
            logger.warning("family %s not loaded: %s", ref, error)
    return found


def plan_yaml(plan: ModelPlan) -> str:
    """The plan as YAML: a document per family, each a tune-many shapes file (``tuner tune-many
    FAMILY --shapes FILE``); the roles and the skipped problems as comments."""
    m = plan.model
    lines = [f"# hidden {m.hidden}, intermediate {m.intermediate}, {m.heads} heads, {m.kv_heads} KV heads, "
             f"head dim {m.head_dim}, {m.dtype}; tokens {','.join(map(str, plan.tokens))}"]
    for skip in plan.skipped:
        lines.append(f"# {skip.line}")
    for family in dict.fromkeys(p.family for p in plan.problems):
        lines += ["---", f"# tuner tune-many {family} --shapes FILE"]
        for p in plan.problems:
            if p.family == family:
                flags = ", ".join(f"{k}: {json.dumps(v)}" for k, v in p.problem.flags)
                shape = ",".join(map(str, p.problem.shape))
                lines.append(f'- {{shape: "{shape}", dtype: {p.problem.dtype}, flags: {{{flags}}}}}'
                             f"  # {', '.join(p.roles)}, {p.tokens} token{'' if p.tokens == 1 else 's'}")
    return "\n".join(lines) + "\n"


# -- the run --------------------------------------------------------------------------------------
def tune_model(
    plan: ModelPlan,
    *,
    db: str | None = None,
    replay: Sequence[str | Path] | None = None,
    options: StudyOptions | None = None,
    pool: PoolOptions | None = None,
    **keywords: Any,
) -> ModelRun:
    """Tune the plan's problems in order, each to the budget of :func:`tuner.tune` (``options``,
    ``pool`` and their keywords as it takes them), through tune-many's run: a problem at its
    budget is skipped, an interrupted one goes on. ``replay``: landscapes (files, folders, names
    a family ships); a problem none records is skipped, with a line."""
    study, where = split_keywords("tune_model", keywords, options, pool)
    api.check_budget(study, where)
    skipped = list(plan.skipped)
    for skip in skipped:
        logger.info("%s", skip.line)
    families = {p.family: lookup.family(p.family) for p in plan.problems}
    wanted = list(plan.problems)
    landscapes: dict[Problem, Path] = {}
    if replay:
        for fam in families.values():
            landscapes.update(recorded_landscapes(fam, replay, others=True))
        for p in [p for p in wanted if p.problem not in landscapes]:
            skip = Skipped(p.family, p.problem.key, ", ".join(p.roles), p.tokens,
                           "no landscape given records it (--replay)")
            logger.info("%s", skip.line)
            skipped.append(skip)
        wanted = [p for p in wanted if p.problem in landscapes]
    done = tune_list([(families[p.family], p.problem) for p in wanted], db=db,
                     landscapes={p.problem: landscapes[p.problem] for p in wanted if p.problem in landscapes},
                     options=study, pool=replace(where, replay=None))
    return ModelRun(replace(plan, problems=tuple(wanted)), tuple(done), tuple(skipped))


def summary_lines(run: ModelRun) -> list[str]:
    """A row per problem tuned (roles, status, the study's trials, the run's time, the best),
    then a line per problem skipped."""
    rows = [("family", "problem", "for", "status", "trials", "time", "best")]
    for planned, tuned in zip(run.plan.problems, run.done):
        r = tuned.result
        what = f"{', '.join(planned.roles)} @ {planned.tokens}"
        if r is None:
            rows.append((planned.family, tuned.problem, what, "not reached", "-", "-", "-"))
            continue
        best = "-" if r.best is None else f"{r.best.median_ms:.4f} ms" + (
            f", {r.best.tflops:.1f} TFLOPS" if r.best.tflops is not None else "")
        rows.append((planned.family, tuned.problem, what, r.status, str(r.previous + r.measured),
                     f"{r.elapsed_s:.1f}s", best))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    return lines + [skip.line for skip in run.skipped]
