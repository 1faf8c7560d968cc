"""Many trials' leases, and many results, each in one transaction.

A coordinator feeding tens of GPUs claims and stores hundreds of trials a second; one
transaction a trial (two round trips and a commit each, the study row locked) made the database
a limit of its own. ``Repository.claim_trial`` and ``record_trial`` are these with a list of one::

    granted = repo.claim_trials(study.id, [params_a, params_b], owner="host:pid", limit=200)
    # [7, ClaimRefused("measured", ...)]: a number, or why that config's lease was refused
    stored = repo.record_trials(study.id, [(7, params_a, outcome)], owner="host:pid")
    # [TrialRecord(...)] or ClaimRefused("lost", ...) where the lease was taken over

The rules, in order along the list: a config
measured or held by another live lease is refused, so is one past the study's ``limit``, and a
config named twice in one list is granted once.

A claim looks its configs up among the study's measured and running trials, and a result its
trial's number: index lookups while PostgreSQL's statistics of the two tables know the study's
size. A study that outgrew them (a new database, or a new study among many older trials) has its
rows read whole by each lookup, growing with the study: on a fresh database claims of 100 configs
took 10 ms at 1,000 trials and 169 ms at 40,000 (docs/BENCHMARKS.md). So the claim that takes a
study past 1,000 trials, 2,000, 4,000 and each doubling on has the two tables analyzed, after its
commit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import SQLAlchemyError

from storage import queries, rows
from storage.errors import ClaimRefused, StorageError, driver_message
from storage.models import RunningTrial, TrialRow, utcnow
from storage.records import LEASE_TTL_S, TRIAL_STATUSES, TrialOutcome, TrialRecord, config_key

logger = logging.getLogger(__name__)

ANALYZE_FROM = 1_000  # trials a study has when its tables are first analyzed; again at each doubling


def trial_values(study_id: int, number: int, params: Mapping[str, Any], outcome: TrialOutcome,
                 created_at: datetime) -> dict[str, Any]:
    """A measured trial's row as the column values of one insert (no ORM object); StorageError
    for a malformed outcome. NaN floats become None (unknown)."""
    status, median_ms = outcome.status, outcome.median_ms
    if status not in TRIAL_STATUSES:
        raise StorageError(f"unknown trial status {status!r} (one of {', '.join(TRIAL_STATUSES)})")
    if status == "ok" and (median_ms is None or not math.isfinite(median_ms)):
        raise StorageError(f"trial {number}: an ok trial needs a finite median_ms, not {median_ms}")
    gpu_state = outcome.gpu_state
    if gpu_state is not None:
        gpu_state = queries.plain_json("gpu_state", gpu_state)
    values = {name: getattr(outcome, name) for name in rows.TRIAL_FIELDS}
    values.update({name: queries.known(value) for name, value in values.items() if isinstance(value, float)})
    plain = queries.plain_json("params", params)
    return {"study_id": study_id, "number": number, "params": plain, "config_key": config_key(plain),
            "status": status, "replayed": bool(outcome.replayed), "gpu_state": gpu_state,
            "created_at": created_at, **values}


class BatchedTrials:
    """``Repository``'s batched claims and results (it provides ``_session``)."""

    def claim_trials(self, study_id: int, params: Sequence[Mapping[str, Any]], *, owner: str | None,
                     limit: int | None = None, ttl_s: float = LEASE_TTL_S) -> list[int | ClaimRefused]:
        """``claim_trial`` for each config of ``params``, in one transaction: for each, its new
        running trial's number, or the :class:`ClaimRefused` saying why not."""
        plain = [queries.plain_json("params", p) for p in params]
        keys = [config_key(p) for p in plain]
        out: list[int | ClaimRefused] = []
        what = "a trial" if len(plain) == 1 else "trials"
        with self._session(f"cannot start {what} of study {study_id}", write=True) as session:  # type: ignore[attr-defined]
            queries.lock_study(session, study_id)
            measured = set(session.scalars(select(TrialRow.config_key).where(
                TrialRow.study_id == study_id, TrialRow.config_key.in_(set(keys)))))
            held = {r.config_key: r for r in session.scalars(select(RunningTrial).where(
                RunningTrial.study_id == study_id, RunningTrial.config_key.in_(set(keys))))}
            number, count = _numbers(session, study_id)
            first = number
            # ``count`` is a bound (the study's trial numbers differ): they are counted (a scan
            # of the study's rows, 0.5 ms at 4,000 on PostgreSQL) only where this batch may reach
            # the limit
            if limit is not None and count + len(plain) > limit:
                count = _trial_count(session, study_id)
            now = utcnow()
            granted: set[str] = set()
            leases: list[dict[str, Any]] = []  # inserted at the end, in one statement (no unit of work)
            for config, key in zip(plain, keys):
                if key in measured:
                    out.append(ClaimRefused("measured", f"config {key[:12]} of study {study_id} is measured"))
                    continue
                if key in granted:
                    out.append(ClaimRefused("held", f"config {key[:12]} is claimed twice in one batch"))
                    continue
                lease = held.get(key)
                if lease is not None:
                    fresh = (now - lease.heartbeat_at).total_seconds() < ttl_s
                    if lease.owner not in (None, owner) and fresh:
                        out.append(ClaimRefused("held", f"config {key[:12]} of study {study_id} is held by {lease.owner}"))
                        continue
                    session.delete(lease)  # a stopped or killed run's: taken over
                    session.flush()
                    count -= 1
                if limit is not None and count >= limit:
                    out.append(ClaimRefused("full", f"study {study_id} has its {limit} trials"))
                    continue
                leases.append({"study_id": study_id, "number": number, "params": config, "config_key": key,
                               "owner": owner, "started_at": now, "heartbeat_at": now})
                granted.add(key)
                out.append(number)
                number += 1
                count += 1
            if leases:
                session.execute(insert(RunningTrial.__table__), leases)
        if _doubled(first, number):
            self._analyze()
        return out

    def _analyze(self) -> None:
        """PostgreSQL's statistics of the trial tables taken again (``ANALYZE``: a sample of
        their rows; inserts and reads go on meanwhile). Not done is logged, never raised: the
        lookups are slower without it, not wrong. Other databases need none (SQLite's planner
        takes the config index without statistics)."""
        engine = self.engine  # type: ignore[attr-defined]
        if engine.dialect.name != "postgresql":
            return
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f"ANALYZE {TrialRow.__tablename__}, {RunningTrial.__tablename__}")
                connection.commit()
        except SQLAlchemyError as error:
            logger.warning("could not analyze the trial tables (lookups slow down as the study grows): %s",
                           driver_message(error))

    def record_trials(self, study_id: int, results: Sequence[tuple[int, Mapping[str, Any], TrialOutcome]],
                      *, owner: str | None = None) -> list[TrialRecord | ClaimRefused]:
        """``record_trial`` for each (number, params, outcome), in one transaction: each trial
        stored in place of its running one, the fastest by ``TrialRecord.ranked_ms`` offered as
        the best; where ``owner``'s lease of it was taken over, nothing is stored for it and its
        entry is ClaimRefused("lost")."""
        now = utcnow()
        made = [trial_values(study_id, number, params, outcome, now) for number, params, outcome in results]
        out: list[TrialRecord | ClaimRefused] = []
        what = f"trial {made[0]['number']}" if len(made) == 1 else "trials"
        with self._session(f"cannot record {what} of study {study_id}", write=True) as session:  # type: ignore[attr-defined]
            study = queries.touch_study(session, study_id, now)  # the row held from here on
            mine = set(session.scalars(delete(RunningTrial).where(
                RunningTrial.study_id == study_id, RunningTrial.number.in_([t["number"] for t in made]),
                *([RunningTrial.owner == owner] if owner is not None else [])).returning(RunningTrial.number)))
            kept = [t for t in made if owner is None or t["number"] in mine]
            records: dict[int, TrialRecord] = {}
            if kept:  # one executemany (no unit of work, no statement of every row's values), then the ids
                session.execute(insert(TrialRow.__table__), kept)
                ids = {number: trial_id for number, trial_id in session.execute(select(TrialRow.number, TrialRow.id).where(
                    TrialRow.study_id == study_id, TrialRow.number.in_([t["number"] for t in kept])))}
                records = {t["number"]: rows.trial_record_of(ids[t["number"]], t) for t in kept}
            for trial in made:
                if trial["number"] not in records:
                    out.append(ClaimRefused("lost", f"trial {trial['number']} of study {study_id}: the lease of "
                                                    f"{owner} was taken over; its result is not stored"))
                else:
                    out.append(records[trial["number"]])
            ok = [r for r in records.values() if r.status == "ok"]
            if ok:  # the fastest alone: offering each in turn ends the same (ties: the first)
                queries.offer_best(session, study, min(ok, key=lambda t: t.ranked_ms))
            return out


def _numbers(session: Any, study_id: int) -> tuple[int, int]:
    """The number a study's next trial takes (one past the last, measured or running), and a
    bound of how many trials it has (the span of their numbers, which differ), in one round
    trip that each table's index on (study_id, number) answers."""
    ends = session.execute(select(*(select(func.min(model.number) if low else func.max(model.number))
                                    .where(model.study_id == study_id).scalar_subquery()
                                    for model in (TrialRow, RunningTrial) for low in (True, False)))).one()
    lows, highs = [n for n in ends[0::2] if n is not None], [n for n in ends[1::2] if n is not None]
    if not highs:
        return 0, 0
    return max(highs) + 1, max(highs) - min(lows) + 1


def _trial_count(session: Any, study_id: int) -> int:
    """A study's trials, measured and running, in one round trip."""
    counts = session.execute(select(*(select(func.count(model.id)).where(model.study_id == study_id)
                                      .scalar_subquery() for model in (TrialRow, RunningTrial)))).one()
    return sum(n or 0 for n in counts)


def _doubled(before: int, after: int) -> bool:
    """Whether a study's trial numbers, ``before`` up to ``after``, passed ``ANALYZE_FROM``
    or one of its doublings."""
    mark = ANALYZE_FROM
    while mark <= after:
        if before < mark:
            return True
        mark *= 2
    return False
