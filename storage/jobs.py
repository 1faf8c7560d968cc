"""The job queue of ``tuner serve``, part of :class:`storage.Repository`: jobs submitted, taken
by a scheduler a slice at a time, cancelled; and the server's tokens, kept as digests.

    job_id = repo.submit_job(JobSpec("attention", [([2, 8, 1024, 64], "fp16", {"causal": True})],
                                     trials=50, priority=1))
    taken = repo.take_job("host:pid", gone=lambda runner, heartbeat: ...)  # the next job's turn
    repo.release_job(taken.id, "host:pid")                                  # its slice done
    both = repo.take_jobs("host:pid", gone, most=2, running=[7])            # two at once, beside job 7

A job is taken by priority (higher first; a lower priority waits while a higher one is open),
and among equal priorities the one whose last slice ended longest ago (never served first, then
the oldest): a later job takes turns with earlier ones of its priority, and is never starved by
them. A job held by a live runner is not taken.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.errors import StorageError
from storage.job_records import JOB_STATES, OPEN_STATES, PROBLEM_STATES, TOKEN_SCOPES, JobProblem, JobRecord
from storage.models import JobProblemRow, JobRow, Study, TokenRow, TrialRow, utcnow


@dataclass(frozen=True)
class JobSpec:
    """What a job is submitted with: its family, its problems (shape, dtype, flags), each one's
    budget of ``trials``, its ``priority`` (higher runs first) and how it searches."""

    family: str
    problems: Sequence[tuple[Sequence[int], str, Mapping[str, Any]]]
    trials: int
    priority: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)


class JobQueue:
    """The methods of the job queue; :class:`storage.Repository` has them (its ``_session``)."""

    _session: Callable[..., Any]

    def submit_job(self, spec: JobSpec) -> int:
        """Store a job, queued, with its problems waiting; its id."""
        with self._session("cannot store the job", write=True) as session:
            job = JobRow(family=spec.family, priority=int(spec.priority), trials=int(spec.trials),
                         state="queued", settings=dict(spec.settings))
            session.add(job)
            session.flush()
            for position, (shape, dtype, flags) in enumerate(spec.problems):
                session.add(JobProblemRow(job_id=job.id, position=position, shape=[int(d) for d in shape],
                                          dtype=dtype, flags=dict(flags), state="waiting"))
            return job.id

    def jobs(self, states: Sequence[str] | None = None) -> list[JobRecord]:
        """Every job (or those in ``states``), newest first, with its problems' progress."""
        with self._session("cannot list jobs") as session:
            query = select(JobRow).order_by(JobRow.id.desc())
            if states is not None:
                query = query.where(JobRow.state.in_(list(states)))
            return _records(session, list(session.scalars(query)))

    def job(self, job_id: int) -> JobRecord | None:
        """The job ``job_id`` with its problems' progress; None where there is none."""
        with self._session(f"cannot read job {job_id}") as session:
            row = session.get(JobRow, job_id)
            return _records(session, [row])[0] if row is not None else None

    def cancel_job(self, job_id: int) -> JobRecord | None:
        """Cancel a queued or running job (a slice running finishes its trials in flight, and
        stores them); a job over already is left as it is. None where there is no such job."""
        with self._session(f"cannot cancel job {job_id}", write=True) as session:
            row = session.get(JobRow, job_id)
            if row is None:
                return None
            if row.state in OPEN_STATES:
                row.state, row.reason, row.finished_at = "cancelled", "cancelled by a client", utcnow()
            session.flush()
            return _records(session, [row])[0]

    def take_job(self, runner: str, gone: Callable[[str | None, datetime | None], bool]) -> JobRecord | None:
        """The next open job whose turn it is, held for ``runner`` (host:pid) from now; None when
        none is free. ``gone(runner, heartbeat)``: whether another runner holding a job is gone."""
        taken = self.take_jobs(runner, gone)
        return taken[0] if taken else None

    def take_jobs(self, runner: str, gone: Callable[[str | None, datetime | None], bool], most: int = 1,
                  running: Collection[int] = ()) -> list[JobRecord]:
        """Up to ``most`` open jobs whose turn it is, in turn order, held for ``runner`` from now:
        jobs of the highest priority among those free to take and those ``runner`` runs now
        (``running``, their ids: not taken again), so that a lower priority waits while a higher
        one is open. ``gone`` as for :meth:`take_job`."""
        with self._session("cannot take a job", write=True) as session:
            query = (select(JobRow).where(JobRow.state.in_(list(OPEN_STATES)))
                     .order_by(JobRow.priority.desc(), JobRow.served_at.is_not(None), JobRow.served_at,
                               JobRow.id))
            rows = list(session.scalars(query))
            free = [row for row in rows if row.id not in running and (
                row.runner in (None, runner) or gone(row.runner, row.heartbeat_at))]
            priorities = [row.priority for row in free] + [row.priority for row in rows if row.id in running]
            taken = [row for row in free if row.priority == max(priorities)][:most] if priorities else []
            now = utcnow()
            for row in taken:
                row.runner, row.heartbeat_at, row.state = runner, now, "running"
                row.started_at = row.started_at or now
            session.flush()
            return _records(session, taken)

    def renew_job(self, job_id: int, runner: str) -> str | None:
        """Renew ``runner``'s hold of a job; the job's state (None: no such job)."""
        with self._session(f"cannot renew job {job_id}", write=True) as session:
            row = session.get(JobRow, job_id)
            if row is None:
                return None
            if row.runner == runner:
                row.heartbeat_at = utcnow()
            return row.state

    def release_job(self, job_id: int, runner: str, *, state: str | None = None,
                    reason: str | None = None) -> None:
        """``runner``'s slice of a job ended: its turn is over; ``state``: the job is over too
        (done or failed; a cancelled job stays cancelled)."""
        if state is not None and state not in JOB_STATES:
            raise StorageError(f"unknown job state {state!r} (one of {', '.join(JOB_STATES)})")
        with self._session(f"cannot release job {job_id}", write=True) as session:
            row = session.get(JobRow, job_id)
            if row is None:
                return
            if row.runner == runner:
                row.runner, row.heartbeat_at = None, None
            row.served_at = utcnow()
            if state is not None and row.state in OPEN_STATES:
                row.state, row.reason, row.finished_at = state, reason, utcnow()

    def set_job_problem(self, job_id: int, position: int, *, state: str | None = None,
                        study: str | None = None, reason: str | None = None) -> None:
        """Record a problem's study (its name), or that it is done or failed (and why)."""
        if state is not None and state not in PROBLEM_STATES:
            raise StorageError(f"unknown problem state {state!r} (one of {', '.join(PROBLEM_STATES)})")
        with self._session(f"cannot update job {job_id}", write=True) as session:
            row = session.scalars(select(JobProblemRow).where(JobProblemRow.job_id == job_id,
                                                              JobProblemRow.position == position)).one()
            if state is not None:
                row.state, row.reason = state, reason
            if study is not None:
                row.study = study

    # -- tokens ---------------------------------------------------------------------------------

    def add_token(self, digest: str, scope: str, label: str | None = None) -> int:
        """Store a token's digest (never its text) with its scope; its id."""
        if scope not in TOKEN_SCOPES:
            raise StorageError(f"unknown token scope {scope!r} (one of {', '.join(TOKEN_SCOPES)})")
        with self._session("cannot store the token", write=True) as session:
            row = TokenRow(digest=digest, scope=scope, label=label)
            session.add(row)
            session.flush()
            return row.id

    def token_scope(self, digest: str) -> tuple[str, str] | None:
        """(the stored digest, its scope) of the token of this digest; None where there is none."""
        with self._session("cannot read tokens") as session:
            row = session.scalars(select(TokenRow).where(TokenRow.digest == digest)).first()
            return (row.digest, row.scope) if row is not None else None

    def token_count(self) -> int:
        """How many tokens are stored."""
        with self._session("cannot read tokens") as session:
            return int(session.scalar(select(func.count()).select_from(TokenRow)) or 0)


def _records(session: Session, jobs: list[JobRow]) -> list[JobRecord]:
    """The records of ``jobs``, their problems with their studies' progress, in two queries."""
    if not jobs:
        return []
    ids = [job.id for job in jobs]
    problems = list(session.scalars(select(JobProblemRow).where(JobProblemRow.job_id.in_(ids))
                                    .order_by(JobProblemRow.job_id, JobProblemRow.position)))
    names = sorted({p.study for p in problems if p.study})
    progress: dict[str, tuple[int, float | None]] = {}
    if names:
        ok_ms = func.min(TrialRow.median_ms).filter(TrialRow.status == "ok")
        query = (select(Study.name, func.count(TrialRow.id), ok_ms)
                 .join(TrialRow, TrialRow.study_id == Study.id, isouter=True)
                 .where(Study.name.in_(names)).group_by(Study.name))
        progress = {name: (int(count), best) for name, count, best in session.execute(query)}
    by_job: dict[int, list[JobProblem]] = {}
    for p in problems:
        measured, best = progress.get(p.study or "", (0, None))
        by_job.setdefault(p.job_id, []).append(JobProblem(
            p.position, tuple(p.shape), p.dtype, dict(p.flags), p.state, p.reason, p.study, measured, best))
    return [JobRecord(job.id, job.family, job.priority, job.trials, job.state, job.reason, dict(job.settings),
                      job.submitted_at, job.started_at, job.finished_at, job.runner,
                      tuple(by_job.get(job.id, ()))) for job in jobs]
