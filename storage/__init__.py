"""Storage of the tuner's results: devices, template versions, problems, studies, trials (measured
and in flight) and the best configuration of each problem, in SQLite or PostgreSQL: the one
record of every trial.

    from storage import open_repository

    repo = open_repository()                      # $TUNER_DB, else sqlite:///./tuner.db
    for summary in repo.studies():
        print(summary.name, summary.n_ok, summary.best_median_ms)

This package uses nothing else of the project; it takes and returns plain values. Each name
below is imported from its module when first used (PEP 562): the records, ``params_key``,
``ranked_ms`` and ``StorageError`` come without SQLAlchemy, which ``open_repository`` and ``Repository`` import.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "storage.engine": ("check_database", "default_url", "missing_sqlite_file", "open_reader", "open_repository",
                       "open_writer",
                       "use_sqlite_writer"),
    "storage.errors": ("ClaimRefused", "StorageError"),
    "storage.job_records": ("JobProblem", "JobRecord"),
    "storage.jobs": ("JobSpec",),
    "storage.records": ("BestRecord", "DeviceRecord", "RetimeEntry", "RetimeRecord", "RunningRecord",
                        "StudyRecord",
                        "StudySpec", "StudySummary", "TrialOutcome", "TrialRecord", "LEASE_RENEW_S", "LEASE_TTL_S",
                        "config_key", "params_key"),
    "storage.ranking": ("RETIMED_FLOOR", "SEARCH_FLOOR", "interval_ms", "ranked_ms", "tied"),
    "storage.repository": ("Repository",),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
