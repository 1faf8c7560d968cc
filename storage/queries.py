"""The statements a Repository runs inside one session; no commits or error handling here.

Each function takes an open :class:`~sqlalchemy.orm.Session` and returns ORM rows (or records
built from them); :mod:`storage.repository` owns the transaction around them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage import rows
from storage.errors import StorageError
from storage.models import (
    Base,
    BestRow,
    Device,
    Family,
    ProblemRow,
    Retime,
    Study,
    TemplateVersion,
    TrialRow,
    utcnow,
)
from storage.ranking import ranked_ms, ranked_ms_sql
from storage.records import StudySummary, TrialRecord

Row = TypeVar("Row", bound=Base)
DEVICE_KEYS = ("name", "sm_count", "compute_capability", "driver_version", "cuda_version")


def known(value: float | None) -> float | None:
    """NaN means unknown: stored as NULL (SQLite would do so anyway, PostgreSQL would not)."""
    return None if value is None or math.isnan(value) else float(value)


_SCALARS = (str, int, bool, type(None))  # exact types JSON keeps as they are


def plain_json(what: str, value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as it will read back from the database (tuples become lists), or StorageError
    when it is not JSON (NaN, Infinity, numpy scalars): refused alike by every backend. A flat
    mapping of strings to plain scalars (a config, a GPU's clocks) is copied without the JSON
    round trip, which would return it unchanged."""
    if all(type(k) is str and (type(v) in _SCALARS or (type(v) is float and math.isfinite(v)))
           for k, v in value.items()):
        return dict(value)
    try:
        return json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise StorageError(f"{what} are not plain JSON: {error}") from None


def get_or_create(
    session: Session, model: type[Row], key: Mapping[str, Any], extra: Mapping[str, Any] = {}
) -> Row:
    """The row of ``model`` with ``key``, inserted with ``extra`` when missing. When a concurrent
    writer inserts the same key first, its row is returned (the insert runs in a savepoint)."""
    stmt = select(model).filter_by(**key)
    row = session.scalars(stmt).one_or_none()
    if row is not None:
        return row
    try:
        savepoint = session.begin_nested()
        with savepoint:
            row = model(**key, **extra)
            session.add(row)
    except IntegrityError:
        row = session.scalars(stmt).one()
    return row


def family(session: Session, name: str) -> Family:
    return get_or_create(session, Family, {"name": name})


def template_version(
    session: Session, family: Family, template_hash: str, space: Mapping[str, Any]
) -> TemplateVersion:
    key = {"family_id": family.id, "template_hash": template_hash}
    return get_or_create(session, TemplateVersion, key, {"space": plain_json("space", space)})


def problem(
    session: Session, family: Family, shape: Sequence[int], dtype: str, flags: Mapping[str, Any]
) -> ProblemRow:
    key = {
        "family_id": family.id,
        "shape": [int(d) for d in shape],
        "dtype": dtype,
        "flags": plain_json("flags", dict(flags)),
    }
    return get_or_create(session, ProblemRow, key)


def device(session: Session, device: Mapping[str, Any]) -> Device:
    """The row of a dict with DEVICE_KEYS (others ignored); capability "9.0" or (9, 0)."""
    missing = [key for key in DEVICE_KEYS if key not in device]
    if missing:
        raise StorageError(f"a device needs {', '.join(missing)}")
    capability = device["compute_capability"]
    if not isinstance(capability, str):
        capability = ".".join(str(part) for part in capability)
    key = {
        "name": str(device["name"]),
        "sm_count": int(device["sm_count"]),
        "compute_capability": capability,
        "driver_version": str(device["driver_version"]),
        "cuda_version": str(device["cuda_version"]),
    }
    return get_or_create(session, Device, key)


def study(session: Session, study_id: int, *, lock: bool = False) -> Study:
    """The study row; ``lock`` holds it (FOR UPDATE on PostgreSQL) until the transaction ends."""
    found = session.get(Study, study_id, with_for_update=lock or None)
    if found is None:
        raise StorageError(f"no study with id {study_id}")
    return found


def lock_study(session: Session, study_id: int) -> None:
    """Hold the study row (FOR UPDATE on PostgreSQL) until the transaction ends, without loading
    it; StorageError when there is no such study."""
    if session.execute(select(Study.id).where(Study.id == study_id).with_for_update()).first() is None:
        raise StorageError(f"no study with id {study_id}")


def touch_study(session: Session, study_id: int, when: datetime) -> Any:
    """Mark the study updated at ``when``, which holds its row until the transaction ends (an
    UPDATE locks it as FOR UPDATE does against the other writers of a study), in one statement;
    its (template_version_id, problem_id, device_id), what :func:`offer_best` needs of it.
    StorageError when there is no such study."""
    table = Study.__table__
    found = session.execute(update(table).where(table.c.id == study_id).values(updated_at=when).returning(
        table.c.template_version_id, table.c.problem_id, table.c.device_id)).first()
    if found is None:
        raise StorageError(f"no study with id {study_id}")
    return found


def offer_best(session: Session, study: Study | Any, trial: TrialRow | TrialRecord) -> None:
    """Make ``trial`` (ok and stored: a flushed row or the record of one) the best of its
    study's (template version, problem, device) when there is none yet or it is strictly faster
    than the stored one: by its normalized median where several GPUs measured the study (then
    stored as the best's median, the reference GPU's time), else by its median. ``study``: its
    row, or anything with its three ids (:func:`touch_study`'s answer)."""
    assert trial.status == "ok" and trial.median_ms is not None
    ranked = ranked_ms(trial.normalized_ms, trial.median_ms)
    tflops = trial.tflops
    if tflops is not None and ranked > 0:  # at the ranked (reference GPU's) time
        tflops = tflops * trial.median_ms / ranked
    values = {"trial_id": trial.id, "median_ms": ranked, "tflops": tflops, "retime_id": None}
    best = _best_row(session, study, values)
    if best is not None and ranked < best.median_ms:
        _set(best, values)


def retime_best(session: Session, study: Study, winner: Retime, retimed: set[int]) -> None:
    """Point the best of the study's (template version, problem, device) at a re-timing's winner
    (ok, flushed), with its re-timed median: always when the stored best was one of the trials
    re-timed (``retimed``: their ids), else only when the winner is strictly faster."""
    assert winner.rank == 1 and winner.median_ms is not None
    values = {"trial_id": winner.trial_id, "median_ms": winner.median_ms,
              "tflops": winner.tflops, "retime_id": winner.id}
    best = _best_row(session, study, values)
    if best is not None and (best.trial_id in retimed or winner.median_ms < best.median_ms):
        _set(best, values)


def _best_row(session: Session, study: Study | Any, values: Mapping[str, Any]) -> BestRow | None:
    """The locked best row of the study's key; None when there was none and ``values`` became it."""
    key = {
        "template_version_id": study.template_version_id,
        "problem_id": study.problem_id,
        "device_id": study.device_id,
    }
    stmt = select(BestRow).filter_by(**key).with_for_update()
    best = session.scalars(stmt).one_or_none()
    if best is None:
        try:
            savepoint = session.begin_nested()
            with savepoint:
                session.add(BestRow(**key, **values))
            return None
        except IntegrityError:  # another writer stored a best for this key just now
            best = session.scalars(stmt).one()
    return best


def _set(best: BestRow, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        setattr(best, name, value)
    best.updated_at = utcnow()


def bests_statement(
    family: str,
    dtype: str | None,
    flags: Mapping[str, Any] | None,
    device_name: str | None,
    template_hash: str | None,
) -> Select[Any]:
    """Stored bests (BestRow) matching the filters (None: any), fastest first, with what
    :func:`rows.best_record` needs."""
    stmt = (
        select(
            BestRow, TrialRow, Study.name, Family.name, TemplateVersion.template_hash, ProblemRow, Device,
            Retime,
        )
        .join(TrialRow, BestRow.trial_id == TrialRow.id)
        .join(Study, TrialRow.study_id == Study.id)
        .join(TemplateVersion, BestRow.template_version_id == TemplateVersion.id)
        .join(Family, TemplateVersion.family_id == Family.id)
        .join(ProblemRow, BestRow.problem_id == ProblemRow.id)
        .join(Device, BestRow.device_id == Device.id)
        .outerjoin(Retime, BestRow.retime_id == Retime.id)
        .where(Family.name == family)
        .order_by(BestRow.median_ms, BestRow.id)
    )
    if dtype is not None:
        stmt = stmt.where(ProblemRow.dtype == dtype)
    if flags is not None:
        stmt = stmt.where(ProblemRow.flags == plain_json("flags", dict(flags)))
    if device_name is not None:
        stmt = stmt.where(Device.name == device_name)
    if template_hash is not None:
        stmt = stmt.where(TemplateVersion.template_hash == template_hash)
    return stmt


def best_statement(
    family: str,
    shape: Sequence[int],
    dtype: str,
    flags: Mapping[str, Any],
    device_name: str | None,
    template_hash: str | None,
) -> Select[Any]:
    """The fastest best row of one problem matching the filters."""
    stmt = bests_statement(family, dtype, flags, device_name, template_hash)
    return stmt.where(ProblemRow.shape == [int(d) for d in shape]).limit(1)


def summaries(session: Session, name: str | None = None) -> list[StudySummary]:
    """Every study (or the one named) with its trial counts, oldest first."""
    ok = TrialRow.status == "ok"
    counts = (
        select(
            TrialRow.study_id,
            func.count().label("n_trials"),
            func.sum(case((ok, 1), else_=0)).label("n_ok"),
            func.min(case((ok, ranked_ms_sql(TrialRow.normalized_ms, TrialRow.median_ms)))).label("best_ms"),
            func.max(case((ok, TrialRow.tflops))).label("best_tflops"),  # same problem: fastest
        )
        .group_by(TrialRow.study_id)
        .subquery()
    )
    stmt = (
        select(
            Study,
            Family.name,
            TemplateVersion.template_hash,
            ProblemRow,
            Device.name,
            counts.c.n_trials,
            counts.c.n_ok,
            counts.c.best_ms,
            counts.c.best_tflops,
        )
        .join(TemplateVersion, Study.template_version_id == TemplateVersion.id)
        .join(Family, TemplateVersion.family_id == Family.id)
        .join(ProblemRow, Study.problem_id == ProblemRow.id)
        .join(Device, Study.device_id == Device.id)
        .outerjoin(counts, counts.c.study_id == Study.id)
        .order_by(Study.created_at, Study.id)
    )
    if name is not None:
        stmt = stmt.where(Study.name == name)
    return [
        rows.study_summary(
            study,
            family_name,
            template_hash,
            problem_row,
            device_name,
            (n_trials, n_ok, best_ms, best_tflops),
        )
        for (
            study,
            family_name,
            template_hash,
            problem_row,
            device_name,
            n_trials,
            n_ok,
            best_ms,
            best_tflops,
        ) in session.execute(stmt)
    ]
