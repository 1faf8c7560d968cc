"""The Repository: every read and write of the tuner's results, one transaction per call.

    repo = open_repository("sqlite:///tuner.db")
    study = repo.open_study(
        "attention-h100-tpe", family="attention", template_hash=family.template_hash,
        space=space, shape=[4, 16, 4096, 128], dtype="fp16", flags={"causal": True},
        device=info.to_json(), sampler="tpe", replay=False, settings={"n_trials": 200},
    )
    number = repo.claim_trial(study.id, params, owner="host:pid", limit=200)  # the config's lease
    repo.renew_leases(study.id, "host:pid")                          # every LEASE_RENEW_S meanwhile
    repo.record_trial(study.id, number, params, TrialOutcome("ok", median_ms=0.41, tflops=612.0),
                      owner="host:pid")
    repo.record_retiming(study.id, [RetimeEntry(trial.number, median_ms=0.42, ...), ...])
    winner = repo.best("attention", [4, 16, 4096, 128], "fp16", True)

Every method runs in :meth:`Repository._session`, which commits, or rolls back and raises
:class:`StorageError` with one line. Methods take plain values and return frozen records.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from storage import queries, rows
from storage.batches import BatchedTrials
from storage.jobs import JobQueue
from storage.errors import ClaimRefused, StorageError, driver_message
from storage.models import BestRow, ProblemRow, Retime, RunningTrial, Study, TrialRow, utcnow
from storage.records import (
    LEASE_TTL_S,
    STUDY_STATUSES,
    BestRecord,
    RetimeEntry,
    RetimeRecord,
    RunningRecord,
    StudyRecord,
    StudySpec,
    StudySummary,
    TrialOutcome,
    TrialRecord,
    params_key,
)

_NUMBERS_A_STATEMENT = 500  # trials read by number: an IN list of at most this many


class Repository(BatchedTrials, JobQueue):
    """The tuner's results in one database (SQLite or PostgreSQL); see :func:`open_repository`.
    Claims and results of many trials in one transaction each: :class:`storage.batches.BatchedTrials`;
    the job queue of ``tuner serve`` and its tokens: :class:`storage.jobs.JobQueue`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._watch: Any = None  # bests_version's connection (SQLite), opened on first use
        self._watch_lock = threading.Lock()
        self._watched: tuple[int | None, tuple[tuple[Any, ...], ...]] = (None, ())

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
                self._watch = None
        self.engine.dispose()

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _session(self, what: str, *, write: bool = False) -> Iterator[Session]:
        """One transaction: commit on success; on any error roll back and raise StorageError.

        ``write`` takes SQLite's write lock at the start (BEGIN IMMEDIATE), so that two writers
        wait for each other instead of failing when both try to turn a read lock into a write.
        """
        session = self._sessions()
        try:
            if write:
                session.connection(execution_options={"sqlite_begin": "BEGIN IMMEDIATE"})
            yield session
            session.commit()
        except StorageError:
            session.rollback()
            raise
        except SQLAlchemyError as error:
            session.rollback()
            raise StorageError(f"{what}: {driver_message(error)}") from error
        finally:
            session.close()

    # -- reference rows ---------------------------------------------------------------------

    def ensure_device(
        self,
        name: str,
        sm_count: int,
        compute_capability: str | Sequence[int],
        driver_version: str,
        cuda_version: str,
    ) -> int:
        """The id of this device, created on first use. ``compute_capability``: "9.0" or (9, 0)."""
        device = {
            "name": name,
            "sm_count": sm_count,
            "compute_capability": compute_capability,
            "driver_version": driver_version,
            "cuda_version": cuda_version,
        }
        with self._session(f"cannot store device {name!r}", write=True) as session:
            return queries.device(session, device).id

    def ensure_template_version(
        self, family: str, template_hash: str, space: Mapping[str, Any]
    ) -> int:
        """The id of this version of a family's template, created on first use."""
        with self._session(
            f"cannot store template {family}/{template_hash}", write=True
        ) as session:
            family_row = queries.family(session, family)
            return queries.template_version(session, family_row, template_hash, space).id

    def ensure_problem(self, family: str, shape: Sequence[int], dtype: str, flags: Mapping[str, Any]) -> int:
        """The id of this problem of a family (its shape, dtype and the family's flags), created
        on first use."""
        with self._session(f"cannot store problem {family} {list(shape)}", write=True) as session:
            return queries.problem(
                session, queries.family(session, family), shape, dtype, flags
            ).id

    # -- studies ----------------------------------------------------------------------------

    def open_study(self, name: str, spec: StudySpec | None = None, /, **fields: Any) -> StudyRecord:
        """Create the study ``name``, or re-open it (its status goes back to 'running'), as
        ``spec`` says (:class:`storage.StudySpec`; or its fields as keywords).

        A study that exists keeps its sampler, replay flag and settings; one that exists for
        another template version, problem or device raises StorageError.
        """
        spec = spec if spec is not None else StudySpec(**fields)
        family, template_hash, space, device = spec.family, spec.template_hash, spec.space, spec.device
        shape, dtype, flags = spec.shape, spec.dtype, spec.flags
        sampler, replay, settings = spec.sampler, spec.replay, spec.settings
        with self._session(f"cannot open study {name!r}", write=True) as session:
            family_row = queries.family(session, family)
            version = queries.template_version(session, family_row, template_hash, space)
            problem = queries.problem(session, family_row, shape, dtype, flags)
            device_row = queries.device(session, device)
            identity = {
                "template_version_id": version.id,
                "problem_id": problem.id,
                "device_id": device_row.id,
            }
            created = {"sampler": sampler, "status": "running", "replay": bool(replay)}
            created.update(settings=queries.plain_json("settings", settings), **identity)
            study = queries.get_or_create(session, Study, {"name": name}, created)
            if any(getattr(study, key) != value for key, value in identity.items()):
                raise StorageError(
                    f"study {name!r} exists for another template version, problem or device"
                )
            if study.status != "running":
                study.status = "running"
                study.updated_at = utcnow()
                session.flush()
            return rows.study_record(study, family_row, version, problem, device_row)

    def set_study_status(self, study_id: int, status: str) -> None:
        """Mark a study 'running', 'finished' or 'interrupted'."""
        if status not in STUDY_STATUSES:
            raise StorageError(
                f"unknown study status {status!r} (one of {', '.join(STUDY_STATUSES)})"
            )
        with self._session(f"cannot set the status of study {study_id}", write=True) as session:
            study = queries.study(session, study_id)
            study.status = status
            study.updated_at = utcnow()

    def studies(self) -> list[StudySummary]:
        """Every study with its trial counts and its fastest ok trial, oldest first."""
        with self._session("cannot list studies") as session:
            return queries.summaries(session)

    def study(self, name: str) -> StudySummary:
        """The summary of the study ``name``; StorageError when there is none."""
        with self._session(f"cannot read study {name!r}") as session:
            found = queries.summaries(session, name)
        if not found:
            raise StorageError(f"no study named {name!r}")
        return found[0]

    def find_study(self, name: str) -> StudySummary | None:
        """The summary of the study ``name``, or None when there is none."""
        with self._session(f"cannot read study {name!r}") as session:
            found = queries.summaries(session, name)
        return found[0] if found else None

    # -- trials -----------------------------------------------------------------------------

    def record_trial(self, study_id: int, number: int, params: Mapping[str, Any],
                     outcome: TrialOutcome, *, owner: str | None = None) -> TrialRecord:
        """Store trial ``number`` of a study, in place of its running trial (claimed by
        :meth:`claim_trial`) when it has one; in the same transaction, make it the best of its
        (template version, problem, device) when it is ok and strictly faster than the stored
        best. Failed trials never become best. NaN floats are stored as None (unknown).

        ``owner``: the lease holder storing its result; where its running trial is no longer
        its own (the lease went stale and another coordinator took it over or dropped it),
        nothing is stored and :class:`ClaimRefused` (``why="lost"``) is raised: the config is
        measured by whoever holds it now, once.
        """
        stored = self.record_trials(study_id, [(number, params, outcome)], owner=owner)[0]
        if isinstance(stored, ClaimRefused):
            raise stored
        return stored

    def claim_trial(self, study_id: int, params: Mapping[str, Any], *, owner: str | None,
                    limit: int | None = None, ttl_s: float = LEASE_TTL_S) -> int:
        """The lease of ``params`` for ``owner`` (host:pid): a running trial under the study's
        next free number (one past every measured or running trial's), which this returns.

        In one transaction, with the study row locked (coordinators sharing a study claim one
        at a time), it is refused (:class:`ClaimRefused`) when the config is measured already
        (``why="measured"``), when another owner's lease renewed within ``ttl_s`` holds it
        (``"held"``), or when the study's measured and running trials reach ``limit``
        (``"full"``). A lease of the config left without an owner (a run that stopped), not
        renewed within ``ttl_s`` (a killed run) or ``owner``'s own (an earlier run of this
        process) is taken over, under a new number."""
        granted = self.claim_trials(study_id, [params], owner=owner, limit=limit, ttl_s=ttl_s)[0]
        if isinstance(granted, ClaimRefused):
            raise granted
        return granted

    def renew_leases(self, study_id: int, owner: str) -> int:
        """Renew every lease ``owner`` holds in the study (its running trials): how many."""
        with self._session(f"cannot renew the leases of study {study_id}", write=True) as session:
            done = session.execute(update(RunningTrial).where(
                RunningTrial.study_id == study_id, RunningTrial.owner == owner).values(heartbeat_at=utcnow()))
            return int(done.rowcount or 0)

    def running(self, study_id: int) -> list[RunningRecord]:
        """The study's running trials (measured now, or left by a run that stopped), by number."""
        with self._session(f"cannot read the running trials of study {study_id}") as session:
            stmt = (select(RunningTrial).where(RunningTrial.study_id == study_id)
                    .order_by(RunningTrial.number))
            return [rows.running_record(running) for running in session.scalars(stmt)]

    def leave_trial(self, study_id: int, number: int) -> None:
        """Leave a running trial to be measured again: no owner, so the next run settles it."""
        with self._session(f"cannot leave trial {number} of study {study_id}", write=True) as session:
            session.execute(update(RunningTrial).where(
                RunningTrial.study_id == study_id, RunningTrial.number == number).values(owner=None))

    def drop_trial(self, study_id: int, number: int) -> bool:
        """Forget a running trial (its config is measured elsewhere, or settled by a resumed
        run); False when it was gone already (another coordinator settled it first)."""
        with self._session(f"cannot drop trial {number} of study {study_id}", write=True) as session:
            done = session.execute(delete(RunningTrial).where(
                RunningTrial.study_id == study_id, RunningTrial.number == number))
            return bool(done.rowcount)

    def trials(self, study_id: int, numbers: Collection[int] | None = None) -> list[TrialRecord]:
        """The trials of a study, ordered by number; ``numbers``: those of these numbers only."""
        with self._session(f"cannot read the trials of study {study_id}") as session:
            queries.study(session, study_id)
            stmt = select(TrialRow).where(TrialRow.study_id == study_id).order_by(TrialRow.number)
            if numbers is None:
                return [rows.trial_record(trial) for trial in session.scalars(stmt)]
            wanted = sorted(set(numbers))
            return [rows.trial_record(trial) for start in range(0, len(wanted), _NUMBERS_A_STATEMENT)
                    for trial in session.scalars(stmt.where(
                        TrialRow.number.in_(wanted[start:start + _NUMBERS_A_STATEMENT])))]

    def trial_numbers(self, study_id: int) -> list[int]:
        """The numbers of a study's stored trials, in order: what a coordinator reads to find
        the trials it lacks (reading every trial grew with the study: 4,000 took tens of ms)."""
        with self._session(f"cannot read the trials of study {study_id}") as session:
            queries.study(session, study_id)
            return list(session.scalars(select(TrialRow.number).where(TrialRow.study_id == study_id)
                                        .order_by(TrialRow.number)))

    def measured(self, study_id: int) -> dict[str, TrialRecord]:
        """The trials of a study keyed by :func:`params_key`; a config measured twice maps to
        its first (lowest-numbered) trial."""
        done: dict[str, TrialRecord] = {}
        for trial in self.trials(study_id):
            done.setdefault(params_key(trial.params), trial)
        return done

    # -- re-timings -------------------------------------------------------------------------

    def record_retiming(
        self,
        study_id: int,
        entries: Sequence[RetimeEntry],
        *,
        gpu_state: Mapping[str, Any] | None = None,
        replayed: bool = False,
        order: Sequence[int] | None = None,
    ) -> list[RetimeRecord]:
        """Store one re-timing of a study's ok trials (one entry per trial, by number) and, in
        the same transaction, point the best of its (template version, problem, device) at the
        winner: the lowest re-timed median (ties: the lower trial number), or the first of
        ``order`` (the ok entries' numbers, best first: ties within the noise broken by the caller). The best moves always
        when it was one of the trials re-timed, else only to a strictly faster winner; when
        every entry failed it stays. Trials are never changed. Returns the rows, ranked first.
        """
        numbers = [entry.number for entry in entries]
        if len(set(numbers)) != len(numbers):
            raise StorageError(f"a re-timing names a trial twice: {sorted(numbers)}")
        for entry in entries:
            if entry.failure is None and (entry.median_ms is None or not math.isfinite(entry.median_ms)):
                raise StorageError(
                    f"trial {entry.number}: a re-timed trial needs a finite median_ms, not {entry.median_ms}"
                )
        if gpu_state is not None:
            gpu_state = queries.plain_json("gpu_state", gpu_state)
        with self._session(f"cannot record a re-timing of study {study_id}", write=True) as session:
            study = queries.study(session, study_id, lock=True)  # one re-timing at a time
            stmt = select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number.in_(numbers))
            trials = {trial.number: trial for trial in session.scalars(stmt)}
            for number in numbers:
                if number not in trials:
                    raise StorageError(f"study {study_id} has no trial {number}")
                if trials[number].status != "ok":
                    raise StorageError(f"trial {number} failed; only ok trials are re-timed")
            latest = select(func.max(Retime.retiming)).where(Retime.study_id == study_id)
            retiming = (session.scalar(latest) or 0) + 1
            ranked = sorted((e for e in entries if e.failure is None),
                            key=lambda e: (e.median_ms, e.number))
            if order is not None:
                place = {number: i for i, number in enumerate(order)}
                if set(place) != {e.number for e in ranked}:
                    raise StorageError(f"a re-timing's order {list(order)} is not its ok trials")
                ranked.sort(key=lambda e: place[e.number])
            rank = {entry.number: place for place, entry in enumerate(ranked, start=1)}
            retimes = [
                Retime(
                    study_id=study_id,
                    retiming=retiming,
                    trial_id=trials[e.number].id,
                    rank=rank.get(e.number),
                    median_ms=queries.known(e.median_ms),
                    iqr_ms=queries.known(e.iqr_ms),
                    min_ms=queries.known(e.min_ms),
                    max_ms=queries.known(e.max_ms),
                    repetitions=e.repetitions,
                    tflops=queries.known(e.tflops),
                    failure=e.failure,
                    reason=e.reason,
                    replayed=bool(replayed),
                    gpu_state=gpu_state,
                )
                for e in entries
            ]
            session.add_all(retimes)
            study.updated_at = utcnow()
            session.flush()
            if ranked:
                winner = next(r for r in retimes if r.rank == 1)
                queries.retime_best(session, study, winner, {t.id for t in trials.values()})
            by_id = {trial.id: trial for trial in trials.values()}
            retimes.sort(key=lambda r: (r.rank is None, r.rank or 0, by_id[r.trial_id].number))
            return [rows.retime_record(r, by_id[r.trial_id]) for r in retimes]

    def retimes(self, study_id: int, *, every: bool = False) -> list[RetimeRecord]:
        """The latest re-timing of a study (every one with ``every``), ranked, failures last;
        [] when it was never re-timed."""
        with self._session(f"cannot read the re-timings of study {study_id}") as session:
            queries.study(session, study_id)
            stmt = (
                select(Retime, TrialRow)
                .join(TrialRow, Retime.trial_id == TrialRow.id)
                .where(Retime.study_id == study_id)
                .order_by(Retime.retiming, Retime.rank.is_(None), Retime.rank, TrialRow.number)
            )
            if not every:
                latest = select(func.max(Retime.retiming)).where(Retime.study_id == study_id)
                stmt = stmt.where(Retime.retiming == latest.scalar_subquery())
            return [rows.retime_record(retime, trial) for retime, trial in session.execute(stmt)]

    def best(
        self,
        family: str,
        shape: Sequence[int],
        dtype: str,
        flags: Mapping[str, Any],
        *,
        device_name: str | None = None,
        template_hash: str | None = None,
    ) -> BestRecord | None:
        """The fastest stored ok trial of a problem, across the devices and template versions
        that match the filters; None when nothing matches."""
        stmt = queries.best_statement(family, shape, dtype, flags, device_name, template_hash)
        with self._session(f"cannot read the best of {family} {list(shape)}") as session:
            row = session.execute(stmt).one_or_none()
            return None if row is None else rows.best_record(*row)

    def bests(
        self,
        family: str,
        *,
        dtype: str | None = None,
        flags: Mapping[str, Any] | None = None,
        device_name: str | None = None,
        template_hash: str | None = None,
    ) -> list[BestRecord]:
        """The stored best of every problem of a family matching the filters, fastest first
        (one row per problem, device and template version)."""
        stmt = queries.bests_statement(family, dtype, flags, device_name, template_hash)
        with self._session(f"cannot read the bests of {family}") as session:
            return [rows.best_record(*row) for row in session.execute(stmt)]

    def study_settings(self) -> dict[str, dict[str, Any]]:
        """Each study's settings by its name (what :meth:`studies` gives, without counting trials)."""
        with self._session("cannot read the studies") as session:
            return {name: dict(settings) for name, settings in session.execute(select(Study.name, Study.settings))}

    def trials_version(self) -> int:
        """The newest stored trial's id (0: none). Trials are only ever added, each with a new,
        higher id, so what is read from the trials holds while it is equal."""
        try:
            with self.engine.connect() as connection:
                return int(connection.execute(select(func.max(TrialRow.id))).scalar() or 0)
        except SQLAlchemyError as error:
            raise StorageError(f"cannot read the stored trials: {driver_message(error)}") from error

    def problem_specs(self, ids: Collection[int]) -> list[tuple[tuple[int, ...], str, dict[str, Any]]]:
        """The (shape, dtype, flags) of the problems of ``ids``."""
        if not ids:
            return []
        stmt = select(ProblemRow.shape, ProblemRow.dtype, ProblemRow.flags).where(ProblemRow.id.in_(list(ids)))
        with self._session("cannot read the problems") as session:
            return [(tuple(shape), dtype, dict(flags)) for shape, dtype, flags in session.execute(stmt)]

    def bests_version(self) -> tuple[tuple[Any, ...], ...]:
        """What each stored best points at, by id: ``(best id, problem id, trial id, re-timing
        id)``. A new best, or one that moves to another trial or re-timing, changes it; the trials and
        re-timings it points at never change, so an answer read from the bests holds while it is
        equal (``tuner.answers.reader`` caches by it)."""
        # It is read before every cached answer. On SQLite, first PRAGMA data_version on a
        # connection of its own: unchanged, nothing was committed since the rows were last read
        # (read after it), and they are returned without reading them again.
        try:
            stamp = self._commit_stamp()
            with self._watch_lock:
                if stamp is not None and stamp == self._watched[0]:
                    return self._watched[1]
            with self.engine.connect() as connection:  # Core, not a Session: it is on every call
                found = tuple(tuple(row) for row in connection.execute(_BESTS_VERSION))
        except (SQLAlchemyError, sqlite3.Error) as error:
            raise StorageError(f"cannot read the stored bests: {driver_message(error)}") from error
        with self._watch_lock:
            self._watched = (stamp, found)
        return found

    def _commit_stamp(self) -> int | None:
        """SQLite's ``PRAGMA data_version`` on a connection kept for it: it changes whenever
        another connection commits. None on other databases."""
        if self.engine.dialect.name != "sqlite":
            return None
        with self._watch_lock:
            if self._watch is None:
                self._watch = self.engine.raw_connection()
            cursor = self._watch.cursor()
            try:
                cursor.execute("PRAGMA data_version")
                return int(cursor.fetchone()[0])
            finally:
                cursor.close()


_BESTS_VERSION = select(BestRow.id, BestRow.problem_id, BestRow.trial_id, BestRow.retime_id).order_by(BestRow.id)
