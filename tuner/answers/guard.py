"""`tuner guard DIR`: a package of ``tuner export-torch`` timed against the vendor's path on its
GPU, each problem's ``use`` set from what was measured::

    table = guard_package("out/tuned_gemm", reps=100, samples=True)
    # tuner guard out/tuned_gemm [--reps 100] [--no-samples] [--json]
    table["problems"][0]["use"], table["problems"][0]["ours_ms"], table["samples"][0]["loss"]

For each tuned row of ``table.json``: ours (the row's kernel, through the package's
``kernel_for``) and the vendor's path (what the op runs when it does not use ours), made by the
package's ``guard_calls`` on the same random inputs, are checked against each other (the
family's tolerance; ours wrong or failing: the vendor's path, with the reason), then timed in
turns in this process (``GpuBench``: tuner/answers/guard_bench.py). ``decide`` keeps ours only
where it won by more than the measurement's spread.

Samples, between the tuned problems: for rows of one dtype and flags, along the dimension in
which they vary most (gemm's M, the token count, over N and K alike), the rounded geometric
midpoint of each neighbouring pair (``sample_problems``). There the any-shape rule's pick
(``torch_runtime.rule_pick``) is timed against the vendor's path the same way, and its ``loss``
recorded (ours' time over the vendor's, less one, where ours is slower). At run time an untuned
problem keeps the rule's pick only between problems of its own line timed here with ours faster
on both sides; elsewhere the vendor's path (``torch_runtime.guarded_choice``).

``table.json`` is written back whole (``write_atomic``) with a ``guard`` stamp: the GPU, the
date, the repetitions.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from templates.family import Problem
from tuner.answers.exporter import write_atomic
from tuner.answers.guard_bench import Comparison, GpuBench, GuardBench, Timing
from tuner.answers.torch_runtime import Choice, rule_pick
from tuner.errors import UsageError

SPREAD_FLOOR = 0.01  # ours must win by at least this share of the vendor's time


def decide(ours: Timing, vendor: Timing) -> tuple[str, str]:
    """("ours" | "vendor", why): ours only where the vendor's median less ours is more than the
    spread, the half-IQRs of both combined in quadrature and at least ``SPREAD_FLOOR`` of the
    vendor's median; a tie is the vendor's."""
    spread = max(math.hypot(ours.iqr_ms / 2, vendor.iqr_ms / 2), SPREAD_FLOOR * vendor.median_ms)
    won = vendor.median_ms - ours.median_ms
    share = f"{abs(won) / vendor.median_ms:.1%}" if vendor.median_ms > 0 else "all"
    if won > spread:
        return "ours", f"ours faster by {won:.4g} ms ({share}), beyond the spread of {spread:.2g} ms"
    if won > 0:
        return "vendor", f"ours faster by {won:.4g} ms ({share}), within the spread of {spread:.2g} ms"
    if won == 0:
        return "vendor", f"ours and the vendor's path alike, {ours.median_ms:.4g} ms"
    return "vendor", f"the vendor's path faster by {-won:.4g} ms ({share})"


def outcome(comparison: Comparison) -> dict[str, Any]:
    """A row's (or sample's) guard fields from its comparison."""
    ours, vendor = comparison.ours, comparison.vendor
    if comparison.wrong or ours is None or vendor is None:
        use, reason = "vendor", comparison.wrong or "not timed"
    else:
        use, reason = decide(ours, vendor)
    return {"ours_ms": ours.median_ms if ours else None, "ours_iqr_ms": ours.iqr_ms if ours else None,
            "vendor_ms": vendor.median_ms if vendor else None, "vendor_iqr_ms": vendor.iqr_ms if vendor else None,
            "use": use, "guard_reason": "; ".join(filter(None, [reason, comparison.note]))}


def loss(fields: Mapping[str, Any]) -> float | None:
    """Ours' time over the vendor's, less one, where ours is slower; 0 where it is not; None
    where either was not timed."""
    ours, vendor = fields.get("ours_ms"), fields.get("vendor_ms")
    if ours is None or vendor is None:
        return None
    return max(0.0, ours / vendor - 1.0)


def sample_problems(rows: Sequence[Mapping[str, Any]]) -> list[tuple[tuple[int, ...], str, dict[str, Any]]]:
    """(shape, dtype, flags) between tuned rows: for rows of one dtype and flags, along the
    dimension with the most distinct values among them (a model's token count), between rows
    alike in every other dimension, the rounded geometric midpoint of each neighbouring pair,
    where an integer lies strictly between them."""
    kinds: dict[tuple[Any, ...], list[tuple[int, ...]]] = {}
    for row in rows:
        kind = (row["dtype"], tuple(sorted(row["flags"].items())), len(row["shape"]))
        kinds.setdefault(kind, []).append(tuple(int(d) for d in row["shape"]))
    found: dict[tuple[Any, ...], tuple[tuple[int, ...], str, dict[str, Any]]] = {}
    for (dtype, flags, rank), shapes in kinds.items():
        axis = max(range(rank), key=lambda a: (len({s[a] for s in shapes}), -a))
        lines: dict[tuple[int, ...], set[int]] = {}
        for shape in shapes:
            lines.setdefault(shape[:axis] + shape[axis + 1:], set()).add(shape[axis])
        for others, values in lines.items():
            ordered = sorted(values)
            for low, high in zip(ordered, ordered[1:]):
                if high - low < 2:
                    continue
                middle = min(max(round(math.sqrt(low * high)), low + 1), high - 1)
                shape = others[:axis] + (middle,) + others[axis:]
                found[(dtype, flags, shape)] = (shape, dtype, dict(flags))
    return [found[key] for key in sorted(found)]


def read_table(folder: str | Path) -> dict[str, Any]:
    """A package's ``table.json``; UsageError (one line) where ``folder`` is not a package of
    ``tuner export-torch``."""
    path = Path(folder)
    if not (path / "table.json").is_file() or not (path / "__init__.py").is_file():
        raise UsageError(f"{path} is not a package of tuner export-torch (it needs table.json and __init__.py)")
    try:
        table = json.loads((path / "table.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read {path / 'table.json'}: {str(error).splitlines()[0]}") from None
    if not isinstance(table, dict) or not {"family", "stamp", "problems"} <= set(table):
        raise UsageError(f"{path / 'table.json'} is not a table of tuner export-torch")
    return table


def import_package(folder: str | Path) -> ModuleType:
    """The package in ``folder``, imported under its folder's name (the one already imported
    from there, its table read again)."""
    path = Path(folder).resolve()
    init = path / "__init__.py"
    loaded = sys.modules.get(path.name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", None) or "").resolve() != init:
            raise UsageError(f"another module called {path.name} is imported here: rename the package's folder")
        loaded.load_table()
        return loaded
    spec = importlib.util.spec_from_file_location(path.name, init, submodule_search_locations=[str(path)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        del sys.modules[path.name]
        raise UsageError(f"cannot import {path}: {str(error).splitlines()[0]}") from None
    return module


def guard_package(folder: str | Path, *, reps: int = 100, samples: bool = True,
                  bench: GuardBench | None = None) -> dict[str, Any]:
    """Time the package in ``folder`` (see the module's docstring) and write its table back;
    returns the table. ``bench``: the GPU's (``GpuBench``) unless given. UsageError (one line)
    on another GPU than the package's."""
    path = Path(folder)
    table = read_table(path)
    package = import_package(path)
    rows = table["problems"]
    picks = [(sample, rule_pick(table, *sample)) for sample in sample_problems(rows)] if samples else []
    if bench is None:
        bench = GpuBench()
    try:
        here, there = bench.gpu_name(), table["stamp"]["gpu"]
        if here != there:
            raise UsageError(f"{path.name} was exported for the {there}, this GPU is the {here}: "
                             "guard it on its own GPU")
        for row in rows:
            choice = Choice("ours", "tuned", row["key"], row["params"], row["key"], row["kernel"])
            problem = Problem(tuple(row["shape"]), row["dtype"], tuple(sorted(row["flags"].items())))
            row.update(_timed(bench, package, choice, problem, reps))
        table["samples"] = [_sample(bench, package, sample, pick, reps) for sample, pick in picks
                            if pick.key is not None]  # None: the family does not take it
    finally:
        bench.close()
    if not samples:
        table.pop("samples", None)
    table["guard"] = {"gpu": here, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "reps": reps,
                      "samples": samples}
    write_atomic(path / "table.json", json.dumps(table, indent=2) + "\n")
    package.load_table()
    return table


def _timed(bench: GuardBench, package: ModuleType, choice: Choice, problem: Problem, reps: int) -> dict[str, Any]:
    """``outcome`` of the bench's comparison; a comparison that raises is the vendor's, with why."""
    try:
        comparison = bench.compare(package, choice, problem, reps)
    except Exception as error:  # a kernel that cannot run here is never the one used
        comparison = Comparison(wrong=f"not timed: {(str(error).splitlines() or [type(error).__name__])[0]}")
    return outcome(comparison)


def _sample(bench: GuardBench, package: ModuleType, sample: tuple[tuple[int, ...], str, dict[str, Any]],
            pick: Choice, reps: int) -> dict[str, Any]:
    """A sample's entry: the rule's pick timed against the vendor's path (where the rule has a
    pick; else the vendor's, with the rule's reason)."""
    shape, dtype, flags = sample
    entry: dict[str, Any] = {"key": pick.key, "shape": list(shape), "dtype": dtype, "flags": dict(flags),
                             "params": dict(pick.params) if pick.params else None, "source": pick.source}
    if pick.use != "ours":  # no config is valid for it
        entry.update(ours_ms=None, ours_iqr_ms=None, vendor_ms=None, vendor_iqr_ms=None, use="vendor",
                     guard_reason=pick.reason, loss=None)
        return entry
    fields = _timed(bench, package, pick, pick.problem, reps)
    entry.update(fields, loss=loss(fields))
    return entry


__all__ = ["SPREAD_FLOOR", "decide", "guard_package", "import_package",
           "loss", "outcome", "read_table", "sample_problems"]
