"""Kernel autotuning: Optuna proposes configs, GPU workers measure them, a database keeps them.

    import tuner

    result = tuner.tune("attention", "4,16,4096,128", "fp16", {"causal": True}, trials=200)
    print(result.best.median_ms, result.best.params)
    tuner.export("attention", "4,16,4096,128", "fp16", {"causal": True}, out_dir="out/")

The same from a shell: ``tuner tune attention --shape 4,16,4096,128 --dtype fp16 --causal``.

``import tuner`` is quick and imports neither Ray nor SQLAlchemy (nor Optuna): the names of
``tuner.api`` and ``tuner.reports.landscape`` are imported when first used (PEP 562), and Ray and the
database only when a call needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported now: ``tuner.bench`` is both a module and the function it defines, and the function
# must be what ``tuner.bench`` names whatever is imported later (``tuner.bench`` is light).
from tuner.reports.bench import BenchRow, bench
from tuner.errors import (
    DatabaseError,
    NoGPU,
    NotFound,
    TemplateMismatch,
    TunerError,
    UsageError,
    WorkerFailure,
)

_MODULES = {
    "tuner.api": ("Derived", "StudyDetail", "TuneResult", "best", "export", "export_optuna", "show",
                  "studies", "tune", "validate"),
    "tuner.answers.sanitize": ("check",),
    "tuner.answers.covered": ("coverage",),
    "tuner.answers.dispatch": ("export_dispatch",),
    "tuner.answers.torch_export": ("export_torch",),
    "tuner.study.many": ("tune_many",),
    "tuner.study.options": ("StudyOptions",),
    "tuner.reports.landscape": ("record_landscape",),
    "tuner.reports.study_plot": ("plot_study",),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "BenchRow",
    "DatabaseError",
    "Derived",
    "NoGPU",
    "NotFound",
    "StudyDetail",
    "StudyOptions",
    "TemplateMismatch",
    "TuneResult",
    "TunerError",
    "UsageError",
    "WorkerFailure",
    "bench",
    "best",
    "check",
    "coverage",
    "export",
    "export_dispatch",
    "export_optuna",
    "export_torch",
    "plot_study",
    "record_landscape",
    "show",
    "studies",
    "tune",
    "tune_many",
    "validate",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
