"""Kernel autotuning: Optuna proposes configs, GPU workers measure them, a database keeps them.

    import tuner

    result = tuner.tune("attention", "4,16,4096,128", "fp16", causal=True, trials=200)
    print(result.best.median_ms, result.best.params)
    tuner.export("attention", "4,16,4096,128", "fp16", causal=True, out_dir="out/")

The same from a shell: ``tuner tune attention --shape 4,16,4096,128 --dtype fp16 --causal``.
"""

from tuner.api import StudyDetail, TuneResult, best, export, show, studies, tune
from tuner.bench import BenchRow, bench
from tuner.landscape import record_landscape
from tuner.errors import (
    DatabaseError,
    NoGPU,
    NotFound,
    TemplateMismatch,
    TunerError,
    UsageError,
    WorkerFailure,
)

__all__ = [
    "BenchRow",
    "DatabaseError",
    "NoGPU",
    "NotFound",
    "StudyDetail",
    "TemplateMismatch",
    "TuneResult",
    "TunerError",
    "UsageError",
    "WorkerFailure",
    "bench",
    "best",
    "export",
    "record_landscape",
    "show",
    "studies",
    "tune",
]
