"""Storage of the tuner's results: devices, template versions, problems, studies, trials and the
best configuration of each problem, in SQLite or PostgreSQL (next to Optuna's own tables).

    from storage import open_repository

    repo = open_repository()                      # $TUNER_DB, else sqlite:///./tuner.db
    for summary in repo.studies():
        print(summary.name, summary.n_ok, summary.best_median_ms)

This package uses nothing else of the project; it takes and returns plain values.
"""

from storage.engine import default_url, open_repository
from storage.errors import StorageError
from storage.records import (
    BestRecord,
    DeviceRecord,
    RetimeEntry,
    RetimeRecord,
    StudyRecord,
    StudySummary,
    TrialRecord,
    params_key,
)
from storage.repository import Repository

__all__ = [
    "BestRecord",
    "DeviceRecord",
    "Repository",
    "RetimeEntry",
    "RetimeRecord",
    "StorageError",
    "StudyRecord",
    "StudySummary",
    "TrialRecord",
    "default_url",
    "open_repository",
    "params_key",
]
