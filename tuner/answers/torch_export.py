"""A family's tuned winners on one GPU as an importable Python package of torch custom ops::

    path = tuner.export_torch("gemm", out_dir="out/")       # out/tuned_gemm/
    # tuner export-torch gemm -o out/ [--device "NVIDIA H200"] [--name tuned_gemm] [--db URL]

    import sys; sys.path.insert(0, "out")
    import tuned_gemm
    c = tuned_gemm.gemm(a, b, bias, epilogue="gelu")        # torch.ops.tuned_gemm.gemm

The package (``torch_package.py.j2`` beside this file renders its ``__init__.py``) holds:

- ``kernels/``: each tuned problem's ``tuner export`` (``.cu`` and ``.launch.json``) and its
  cubin, compiled here by the tuner's compile path (NVRTC or nvcc, for ``sm_90a``: no GPU needed);
- ``table.json``: each tuned problem's shape, dtype, flags, config, times and ``use`` ("ours",
  or "vendor" where the vendor's path was measured faster: the rows are written "ours", and
  ``tuner guard`` times them against the vendor's, tuner/answers/guard.py), and the limits of
  the GPU each won on, which is the any-shape rule's data (tuner/answers/rule.py);
- a stamp: GPU name, driver, CUDA version, the toolkits (the search's and the cubins'), the
  template hash, the date.

Its ops pick as ``tuner best --device GPU`` does (the tuned problem's winner, else the rule's
pick from the table), or the vendor's path (``tuner.answers.torch_runtime``).
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import jinja2

from templates.family import DeviceLimits, KernelFamily
from tuner import database, lookup
from tuner.answers.dispatch import exportable, table_bests
from tuner.answers.exporter import ARCH, render_export, write_atomic, write_export
from tuner.answers.rule import problem_of
from tuner.api import limits_by_study
from tuner.errors import TunerError, UsageError

_ENVIRONMENT = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                                  undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def package_name(family: KernelFamily, name: str | None = None) -> str:
    """The package's (and its ops' namespace's) name: ``name``, else ``tuned_<family>``; a
    Python identifier, UsageError otherwise."""
    chosen = name or f"tuned_{family.name}"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", chosen):
        raise UsageError(f"package name {chosen!r} is not a Python identifier")
    return chosen


def table_document(family: KernelFamily, bests: Sequence[Any], limits_of: Callable[[Any], DeviceLimits],
                   *, toolkit: str) -> dict[str, Any]:
    """``table.json``'s content for ``bests`` (``table_bests``' list); ``toolkit``: what
    compiled the package's cubins."""
    first = bests[0]
    stamp = {
        "gpu": first.device.name,
        "compute_capability": first.device.compute_capability,
        "driver_version": first.device.driver_version,
        "cuda_version": first.device.cuda_version,
        "measured_with": sorted({b.toolkit for b in bests if b.toolkit}),
        "cubins_compiled_with": toolkit,
        "arch": ARCH,
        "template_hash": family.template_hash,
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    problems = []
    for best in bests:
        problem = problem_of(best)
        problems.append({
            "key": problem.key,
            "shape": list(problem.shape),
            "dtype": problem.dtype,
            "flags": dict(problem.flags),
            "params": family.complete(best.params),
            "median_ms": best.median_ms,
            "interval_ms": best.interval_ms,
            "use": "ours",  # "vendor": the vendor's path beat it by more than the noise
            "kernel": f"{family.name}_{problem.key}",
            "template_hash": best.template_hash,
            "study": best.study,
            "limits": limits_of(best).to_json(),
        })
    return {"format": 1, "family": family.name, "dtypes": list(family.dtypes), "stamp": stamp,
            "problems": problems}


def render_package(name: str, family: KernelFamily, table: dict[str, Any]) -> str:
    """The package's ``__init__.py``: this folder's ``torch_package.py.j2`` holding the family's
    op (its ``torch_op_file``)."""
    if not family.torch_op_file:
        raise UsageError(f"{family.name} has no torch op (its family defines no torch_op_file)")
    fam_env = jinja2.Environment(loader=jinja2.FileSystemLoader(family.folder), undefined=jinja2.StrictUndefined,
                                 keep_trailing_newline=True)
    op = fam_env.get_template(family.torch_op_file).make_module({"name": name, "family": family.name})
    return _ENVIRONMENT.get_template("torch_package.py.j2").render(
        name=name, family=family.name, family_op=str(op).strip("\n") + "\n", usage=str(op.usage).strip("\n"),
        gpu=table["stamp"]["gpu"],
        template_hash=family.template_hash, written=table["stamp"]["written"],
        problems=[p["key"] for p in table["problems"]])


def export_torch(family: str | KernelFamily, *, out_dir: str | Path, db: str | None = None,
                 device: str | None = None, name: str | None = None) -> Path:
    """Write the package ``<out_dir>/<name>/`` (see the module's docstring); returns its folder.
    Each tuned problem's kernel is compiled on this machine (CompileError: its log)."""
    from workers.compile import compile_cubin, default_cache_dir, toolkit_version
    from workers.errors import CompileError
    from workers.results import CompileRequest

    fam = lookup.family(family)
    chosen_name = package_name(fam, name)
    if not fam.torch_op_file:
        raise UsageError(f"{fam.name} has no torch op (its family defines no torch_op_file)")
    with database.repository(database.url(db), create=False) as repo:
        stored = database.call(lambda: repo.bests(fam.name, device_name=device))
        limits_of = limits_by_study(database.call(repo.study_settings))
    chosen = table_bests(fam, exportable(fam, stored), device)
    exports = [render_export(fam, problem_of(best), best) for best in chosen]
    cubins = []
    for export, best in zip(exports, chosen):
        request = CompileRequest(export.source, export.launch["kernel"],
                                 tuple(fam.compile_options(best.params, problem_of(best))), ARCH)
        try:
            cubins.append(compile_cubin(request, cache_dir=default_cache_dir()).cubin)
        except CompileError as error:
            raise TunerError(f"{export.name} does not compile here: {str(error).splitlines()[0]}") from None
    table = table_document(fam, chosen, limits_of, toolkit=toolkit_version())
    text = render_package(chosen_name, fam, table)
    folder = Path(out_dir) / chosen_name
    try:
        if folder.exists():
            if not (folder / "table.json").is_file():
                raise UsageError(f"{folder} exists and is not an exported package: choose another -o or --name")
            shutil.rmtree(folder)
        kernels = folder / "kernels"
        for export, cubin in zip(exports, cubins):
            cu = write_export(export, kernels)
            cu.with_suffix(".cubin").write_bytes(cubin)
        write_atomic(folder / "table.json", json.dumps(table, indent=2) + "\n")
        write_atomic(folder / "__init__.py", text)
    except OSError as error:
        raise UsageError(f"cannot write to {out_dir}: {error.strerror or error}") from None
    return folder


__all__ = ["export_torch", "package_name", "render_package", "table_document"]
