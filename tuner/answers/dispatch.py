"""A family's tuned winners on one GPU as one C++ header: a dispatch table from a runtime shape to
a config to a kernel launch, with the rule of `tuner best` (tuner/answers/rule.py) for shapes not tuned::

    path = tuner.export_dispatch("attention", out_dir="out/")          # out/attention_dispatch.h
    # tuner export-dispatch attention -o out/ [--device "NVIDIA H200"] [--db URL]

The header (``dispatch.h.j2`` beside this file) holds the winners of the current template version
on one GPU, every config's CUDA source for each variant the family names
(``KernelFamily.dispatch_variants``: what the source depends on beyond dtype and flags), and the
family's own C++ (its ``dispatch_file``): the problem's checks, its ``distance``, the constraints
that depend on the shape, the variant of a shape, and the launch for a shape. Block, dynamic
shared memory, workspace and the blocks-per-SM cap come from the family's launch of the variant's
problem (they depend on the config and the variant, not on the runtime shape).
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import jinja2

from templates.family import DeviceLimits, KernelFamily, Problem
from tuner import database, lookup
from tuner.answers.exporter import ARCH, write_atomic
from tuner.answers.rule import problem_of
from tuner.api import limits_by_study
from tuner.errors import NotFound, UsageError

logger = logging.getLogger("tuner")

_ENVIRONMENT = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                                  undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_END_OF_SOURCE = ")tuned_src\""


def header_name(family: KernelFamily) -> str:
    return f"{family.name}_dispatch"


def table_bests(family: KernelFamily, bests: Sequence[Any], device: str | None = None) -> list[Any]:
    """The stored bests a header holds: the current template version's, of one GPU (``device``,
    or the only one), one per problem, sorted by problem key. UsageError/NotFound otherwise."""
    current = [b for b in bests if b.template_hash == family.template_hash
               and (device is None or b.device.name == device)]
    gpus = sorted({b.device.name for b in current})
    if not current:
        where = f" on {device}" if device else ""
        raise NotFound(f"no winner of {family.name}'s current template ({family.template_hash}) is stored{where}; "
                       "tune first")
    if len(gpus) > 1:
        raise UsageError(f"{family.name} is tuned on several GPUs ({', '.join(gpus)}): choose one with --device")
    chosen: dict[str, Any] = {}
    for best in current:  # fastest first from the repository: keep the first of each problem
        chosen.setdefault(problem_of(best).key, best)
    return [chosen[key] for key in sorted(chosen)]


def exportable(family: KernelFamily, bests: Sequence[Any]) -> list[Any]:
    """``bests`` less those of problems the family exports to neither the C++ dispatch nor the
    torch op (``export_refusal``: gemm's e4m3), each reason logged once as a warning; where none
    is left, UsageError with the first reason."""
    kept, left = [], {}
    for best in bests:
        problem = problem_of(best)
        reason = family.export_refusal(problem)
        if reason is None:
            kept.append(best)
        else:
            left.setdefault(reason, []).append(problem.key)
    if left and not kept:
        reason, keys = next(iter(left.items()))
        raise UsageError(f"{keys[0]}: {reason}")
    for reason, keys in left.items():
        shown = ", ".join(sorted(set(keys))[:3]) + (", ..." if len(set(keys)) > 3 else "")
        logger.warning("%s: %d stored winner(s) left out (%s): %s", family.name, len(keys), shown, reason)
    return kept


def refuse_unexported(family: KernelFamily, problems: Sequence[Any]) -> None:
    """UsageError with the family's reason where it exports none of one of ``problems``."""
    for problem in problems:
        reason = family.export_refusal(problem)
        if reason:
            raise UsageError(f"{problem.key}: {reason}")


def render_header(family: KernelFamily, bests: Sequence[Any], limits_of: Callable[[Any], DeviceLimits]) -> str:
    """The header's text for ``bests`` (``table_bests``' list); ``limits_of``: a best -> the
    limits of the GPU it won on (``tuner.api.limits_by_study``)."""
    if not family.dispatch_file:
        raise UsageError(f"{family.name} has no C++ dispatch (its family defines no dispatch_file)")
    fam_env = jinja2.Environment(loader=jinja2.FileSystemLoader(family.folder), undefined=jinja2.StrictUndefined,
                                 keep_trailing_newline=True)
    family_cpp = fam_env.get_template(family.dispatch_file).render()
    configs: list[dict[str, Any]] = []
    entries, kernels, sources = [], [], []
    problems = [problem_of(b) for b in bests]
    refuse_unexported(family, problems)
    for best, problem in zip(bests, problems):
        params = family.complete(best.params)
        if params not in configs:
            configs.append(params)
        entries.append((problem, configs.index(params), best.median_ms))
    seen = set()  # a winner serves the problems at a finite distance of its own: every variant of those
    for best, (problem, config, _) in zip(bests, entries):
        for variant, representative in sorted(family.dispatch_variants(problem).items()):
            # not on a variant its family's check refuses (a TMA map needing aligned rows, say):
            # the header's check refuses those problems before a lookup
            if (_kind(problem), config, variant) not in seen \
                    and family.check(configs[config], representative, limits_of(best)) is None:
                seen.add((_kind(problem), config, variant))
                kernels.append(_kernel(family, configs[config], _kind(problem), config, variant, representative,
                                       sources))
    # the flags the table's problems carry (a family's problems may carry fewer than it declares:
    # gemm's fp16 and bf16 ones carry neither of e4m3's out_dtype and scale)
    carried = {name for problem in problems for name, _ in problem.flags}
    flags = [f for f in family.flags if f.name in carried]
    first = problems[0]
    launch = family.launch(configs[entries[0][1]], first)
    # one kernel name and one set of compiler options for the whole table (both are the header's)
    names = {family.launch(configs[c], p).kernel for p, c, _ in entries}
    options = {tuple(o for o in family.compile_options(configs[c], p) if not re.fullmatch(r"-O\d", o))
               for p, c, _ in entries}
    if len(names) > 1 or len(options) > 1:
        raise UsageError(f"{family.name}: its configs name several kernels or compiler options "
                         f"({sorted(names)}, {sorted(options)}); the C++ dispatch takes one of each")
    buffer_names = sorted({a.value.buffer if a.kind == "tensormap" else a.value for a in launch.args
                           if a.kind in ("buffer", "tensormap")} - {name for name, _ in launch.workspace})
    return _ENVIRONMENT.get_template("dispatch.h.j2").render(
        name=header_name(family),
        family=family.name,
        namespace=f"tuned_{_identifier(family.name)}",
        gpu=bests[0].device.name,
        written=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        template_hash=family.template_hash,
        entries=[_entry(p, c, m) for p, c, m in entries],
        configs=[_config(family, c) for c in configs],
        config_fields=[(p.name, _ctype(p.choices)) for p in family.params],
        kernels=kernels,
        sources=sources,
        rank=max(len(p.shape) for p, _, _ in entries),
        flag_count=max(1, len(flags)),
        flag_names=[f.name for f in flags],
        flag_defaults=[_flag_text(f.choices[0]) for f in flags],
        flag_choices=["|" + "|".join(_flag_text(c) for c in f.choices) + "|" for f in flags],
        dtypes="|" + "|".join(family.dtypes) + "|",
        arch=ARCH,
        kernel_name=launch.kernel,
        options=list(options.pop()),  # NVRTC optimises by default and refuses -O3
        family_file=f"templates/{family.folder.name}/{family.dispatch_file}",
        family_cpp=family_cpp,
        neighbours=_neighbours(family_cpp),
        example_shape="{" + ", ".join(str(n) for n in first.shape) + "}",
        example_dtype=first.dtype,
        example_flags=", ".join(f'{{"{n}", "{_flag_text(v)}"}}' for n, v in first.flags),
        example_buffers=", ".join(f'{{"{n}", {n}_ptr}}' for n in buffer_names),
    )


def export_dispatch(family: str | KernelFamily, *, out_dir: str | Path, db: str | None = None,
                    device: str | None = None) -> Path:
    """Write ``<family>_dispatch.h`` into ``out_dir`` from the family's stored winners (see the
    module's docstring); returns its path."""
    fam = lookup.family(family)
    with database.repository(database.url(db), create=False) as repo:
        bests = database.call(lambda: repo.bests(fam.name, device_name=device))
        limits_of = limits_by_study(database.call(repo.study_settings))
    chosen = table_bests(fam, exportable(fam, bests), device)
    text = render_header(fam, chosen, limits_of)
    out = Path(out_dir)
    path = out / f"{header_name(fam)}.h"
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        write_atomic(out / f"{header_name(fam)}.json", json.dumps(
            {"family": fam.name, "gpu": chosen[0].device.name, "template_hash": fam.template_hash,
             "problems": [{"key": problem_of(b).key, "params": fam.complete(b.params), "median_ms": b.median_ms}
                          for b in chosen]}, indent=2) + "\n")
    except OSError as error:
        raise UsageError(f"cannot write to {out_dir}: {error.strerror or error}") from None
    return path


# -- the table's rows ------------------------------------------------------------------------------
def _neighbours(family_cpp: str) -> str:
    """The family's NEIGHBOURS string (what problems at a finite distance share), for the header's
    opening comment."""
    found = re.search(r'NEIGHBOURS\s*=\s*"its ([^"]*)"', family_cpp)
    return found.group(1) if found else "dtype and flags"


def _kind(problem: Problem) -> str:
    """The key without the shape (``fp16-causal``): what C++'s Problem::kind gives."""
    return problem.key.split("-", 1)[1]


def _kernel(family: KernelFamily, params: dict[str, Any], kind: str, config: int, variant: int,
            problem: Problem, sources: list[str]) -> str:
    source = family.render(params, problem)
    if _END_OF_SOURCE in source:
        raise UsageError(f"{family.name}: a kernel source holds {_END_OF_SOURCE!r}; it cannot be a C++ raw string")
    if source not in sources:
        sources.append(source)
    launch = family.launch(params, problem)
    if launch.then:
        raise UsageError(f"{family.name}: the C++ dispatch launches one kernel a config, this one queues "
                         f"{len(launch.kernels)}")
    workspace = ";".join(f"{name}:{nbytes}" for name, nbytes in launch.workspace) + (";" if launch.workspace else "")
    block = ", ".join(str(n) for n in launch.block)
    return (f'{{"{kind}", {config}, {variant}, {sources.index(source)}, {{{block}}}, {launch.smem_bytes}, '
            f'{launch.blocks_per_sm_cap}, "{workspace}"}}')


def _entry(problem: Problem, config: int, median_ms: float) -> str:
    shape = ", ".join(str(n) for n in problem.shape)
    flags = ", ".join(f'"{_flag_text(v)}"' for _, v in problem.flags) or "nullptr"
    return (f'{{"{problem.key}", {len(problem.shape)}, {{{shape}}}, "{problem.dtype}", {{{flags}}}, {config}, '
            f'{median_ms!r}}}')


def _config(family: KernelFamily, params: dict[str, Any]) -> str:
    return ", ".join(f'"{params[p.name]}"' if isinstance(params[p.name], str) else str(int(params[p.name]))
                     for p in family.params)


def _ctype(choices: tuple[Any, ...]) -> str:
    if all(isinstance(c, str) for c in choices):
        return "const char*"
    if all(isinstance(c, (int, bool)) for c in choices):
        return "int"
    raise UsageError(f"a parameter of choices {list(choices)}: the C++ dispatch takes integers and strings")


def _flag_text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _identifier(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    return text if not text[:1].isdigit() else f"_{text}"


__all__ = ["export_dispatch", "exportable", "header_name", "render_header", "table_bests"]
