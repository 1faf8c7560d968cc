"""Plain values of the job queue (``storage.jobs``): a job, its problems and their progress.

Frozen and free of database handles, as the other records (``storage.records``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
OPEN_STATES = ("queued", "running")  # a job still to be run
PROBLEM_STATES = ("waiting", "done", "failed")
TOKEN_SCOPES = ("read", "write")


@dataclass(frozen=True)
class JobProblem:
    """One problem of a job: its place in the job, its spec, and its study's progress (trials
    measured, the fastest ok median) as stored now."""

    position: int
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]
    state: str  # "waiting" | "done" | "failed"
    reason: str | None = None
    study: str | None = None  # its study's name, once it ran
    measured: int = 0
    best_median_ms: float | None = None


@dataclass(frozen=True)
class JobRecord:
    """A submitted job, its problems in order."""

    id: int
    family: str
    priority: int
    trials: int  # each problem's budget
    state: str
    reason: str | None
    settings: dict[str, Any]
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    runner: str | None
    problems: tuple[JobProblem, ...] = field(default=())

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES
