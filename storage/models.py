"""The tables of the tuner, as a typed SQLAlchemy 2 ORM.

Every table is prefixed ``tuner_``: databases written by earlier versions also hold Optuna's
RDB tables (``studies``, ``trials``, ``alembic_version``), which this version leaves alone. Relationships are declared with
``lazy="raise"``: a query that needs a related row loads it explicitly (``joinedload``), so no
query ever runs by surprise. The schema itself is created by the Alembic migrations in
``storage/migrations``, never by ``metadata.create_all``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as naive UTC (the same on SQLite and PostgreSQL), read back aware."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


class CanonicalJSON(TypeDecorator[Any]):
    """JSON stored as canonical text, so it can be part of a unique key and compared with ``==``.

    (PostgreSQL's ``json`` type has no equality operator; the text of equal values is equal.)
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        if value is None:
            return None
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def process_result_value(self, value: str | None, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(none_as_null=True)}


class Device(Base):
    __tablename__ = "tuner_devices"
    __table_args__ = (
        UniqueConstraint(
            "name", "sm_count", "compute_capability", "driver_version", "cuda_version"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String)
    sm_count: Mapped[int]
    compute_capability: Mapped[str] = mapped_column(String)
    driver_version: Mapped[str] = mapped_column(String)
    cuda_version: Mapped[str] = mapped_column(String)


class Family(Base):
    __tablename__ = "tuner_families"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)


class TemplateVersion(Base):
    __tablename__ = "tuner_template_versions"
    __table_args__ = (UniqueConstraint("family_id", "template_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    family_id: Mapped[int] = mapped_column(ForeignKey("tuner_families.id"))
    template_hash: Mapped[str] = mapped_column(String)
    space: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    family: Mapped[Family] = relationship(lazy="raise")


class ProblemRow(Base):
    __tablename__ = "tuner_problems"
    # A problem is its family's spec: shape, element type and the family's own flags (what they
    # mean is the family's business, not the storage's).
    __table_args__ = (UniqueConstraint("family_id", "shape", "dtype", "flags"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    family_id: Mapped[int] = mapped_column(ForeignKey("tuner_families.id"))
    shape: Mapped[list[int]] = mapped_column(CanonicalJSON)
    dtype: Mapped[str] = mapped_column(String)
    flags: Mapped[dict[str, Any]] = mapped_column(CanonicalJSON)

    family: Mapped[Family] = relationship(lazy="raise")


class Study(Base):
    __tablename__ = "tuner_studies"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'finished', 'interrupted')", name="status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    template_version_id: Mapped[int] = mapped_column(ForeignKey("tuner_template_versions.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("tuner_problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    sampler: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String)
    replay: Mapped[bool] = mapped_column(Boolean)
    settings: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    template_version: Mapped[TemplateVersion] = relationship(lazy="raise")
    problem: Mapped[ProblemRow] = relationship(lazy="raise")
    device: Mapped[Device] = relationship(lazy="raise")


class TrialRow(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        CheckConstraint("status IN ('ok', 'failed')", name="status"),
        CheckConstraint("status <> 'ok' OR median_ms IS NOT NULL", name="ok_timed"),
        Index(None, "config_key", "study_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"))
    number: Mapped[int]
    params: Mapped[dict[str, Any]]
    config_key: Mapped[str] = mapped_column(String)  # storage.records.config_key(params)
    status: Mapped[str] = mapped_column(String)
    failure: Mapped[str | None] = mapped_column(String)
    reason: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text, default="")
    registers: Mapped[int | None]
    smem_static: Mapped[int | None]
    stack_bytes: Mapped[int | None]
    spill_stores: Mapped[int | None]
    spill_loads: Mapped[int | None]
    cubin_hash: Mapped[str | None] = mapped_column(String)
    toolkit: Mapped[str | None] = mapped_column(String)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    median_ms: Mapped[float | None] = mapped_column(Float)
    min_ms: Mapped[float | None] = mapped_column(Float)
    max_ms: Mapped[float | None] = mapped_column(Float)
    iqr_ms: Mapped[float | None] = mapped_column(Float)
    repetitions: Mapped[int | None]
    tflops: Mapped[float | None] = mapped_column(Float)
    error: Mapped[float | None] = mapped_column(Float)
    max_abs_error: Mapped[float | None] = mapped_column(Float)
    replayed: Mapped[bool] = mapped_column(Boolean, default=False)
    # the GPU's name and its clocks, temperature and power before and after the timing
    gpu_state: Mapped[dict[str, Any] | None]
    gpu_uuid: Mapped[str | None] = mapped_column(String)  # the GPU that measured it
    gpu_index: Mapped[int | None]  # its index on its machine (NVML's)
    # the median scaled to the study's reference GPU (several GPUs; the median is never altered)
    normalized_ms: Mapped[float | None] = mapped_column(Float)
    gpu_ratio: Mapped[float | None] = mapped_column(Float)  # the GPU's ratio used for it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    study: Mapped[Study] = relationship(lazy="raise")


class RunningTrial(Base):
    """A trial sent to a GPU and not yet measured: its number is taken, its config claimed.

    ``Repository.record_trial`` replaces it by the measured trial in one transaction, so a trial
    is in one table or the other, never both. A row whose owner is gone (a killed run) or None
    (a run that stopped and left it to be measured again) is settled by the next run.

    It is the lease of its config: one running row per (study, config), so coordinators sharing
    a study never measure one config together; its owner renews ``heartbeat_at`` while it
    measures, and a row not renewed for ``storage.records.LEASE_TTL_S`` may be taken over.
    """

    __tablename__ = "tuner_running_trials"
    __table_args__ = (UniqueConstraint("study_id", "number"), UniqueConstraint("config_key", "study_id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"))
    number: Mapped[int]
    params: Mapped[dict[str, Any]]
    config_key: Mapped[str] = mapped_column(String)  # storage.records.config_key(params)
    owner: Mapped[str | None] = mapped_column(String)  # host:pid of the coordinator measuring it
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)  # the owner's last renewal


class Retime(Base):
    """One trial in a re-timing of its study's fastest trials, timed again interleaved on one GPU
    at the end of a run: ranked by the re-timed median (1 wins), or failed with its reason."""

    __tablename__ = "tuner_retimes"
    __table_args__ = (
        UniqueConstraint("study_id", "retiming", "trial_id"),
        CheckConstraint(
            "failure IS NOT NULL OR (rank IS NOT NULL AND median_ms IS NOT NULL)", name="ok_ranked"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"))
    retiming: Mapped[int]  # 1 for the study's first re-timing, 2 for the next (a resumed run), ...
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id"))
    rank: Mapped[int | None]
    median_ms: Mapped[float | None] = mapped_column(Float)
    iqr_ms: Mapped[float | None] = mapped_column(Float)
    min_ms: Mapped[float | None] = mapped_column(Float)
    max_ms: Mapped[float | None] = mapped_column(Float)
    repetitions: Mapped[int | None]
    tflops: Mapped[float | None] = mapped_column(Float)
    failure: Mapped[str | None] = mapped_column(String)
    reason: Mapped[str | None] = mapped_column(Text)
    replayed: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_state: Mapped[dict[str, Any] | None]  # clocks and temperature before and after
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    trial: Mapped[TrialRow] = relationship(lazy="raise")


class BestRow(Base):
    """The fastest ok trial per (template version, problem, device), kept by ``record_trial``;
    a re-timing (``record_retiming``) points it at its winner, with the re-timed median."""

    __tablename__ = "tuner_best"
    __table_args__ = (UniqueConstraint("template_version_id", "problem_id", "device_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    template_version_id: Mapped[int] = mapped_column(ForeignKey("tuner_template_versions.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("tuner_problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id"))
    median_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    retime_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_retimes.id"))  # None: search time
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    trial: Mapped[TrialRow] = relationship(lazy="raise")


class JobRow(Base):
    """A job a client submitted: problems of one family, each to be tuned to ``trials`` trials,
    run by priority (higher first), and among equal priorities the one served longest ago first.

    ``runner`` (host:pid) holds it while a scheduler runs a slice of it, renewing
    ``heartbeat_at``; a runner gone (killed) leaves it to the next scheduler."""

    __tablename__ = "tuner_jobs"
    __table_args__ = (
        CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')", name="state"),
        Index(None, "state", "priority"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    family: Mapped[str] = mapped_column(String)
    priority: Mapped[int]
    trials: Mapped[int]  # the budget of each problem: measured trials of its study
    state: Mapped[str] = mapped_column(String)
    reason: Mapped[str | None] = mapped_column(Text)
    settings: Mapped[dict[str, Any]]  # how it searches (sampler, seed)
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    served_at: Mapped[datetime | None]  # when its last slice ended: the fair turn among equals
    runner: Mapped[str | None] = mapped_column(String)
    heartbeat_at: Mapped[datetime | None]


class JobProblemRow(Base):
    """One problem of a job, in the order submitted; ``study`` names its study once it ran."""

    __tablename__ = "tuner_job_problems"
    __table_args__ = (
        UniqueConstraint("job_id", "position"),
        CheckConstraint("state IN ('waiting', 'done', 'failed')", name="state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("tuner_jobs.id"))
    position: Mapped[int]
    shape: Mapped[list[int]] = mapped_column(CanonicalJSON)
    dtype: Mapped[str] = mapped_column(String)
    flags: Mapped[dict[str, Any]] = mapped_column(CanonicalJSON)
    state: Mapped[str] = mapped_column(String)
    reason: Mapped[str | None] = mapped_column(Text)
    study: Mapped[str | None] = mapped_column(String)


class TokenRow(Base):
    """An API token of ``tuner serve``: only the SHA-256 of its text is stored."""

    __tablename__ = "tuner_tokens"
    __table_args__ = (CheckConstraint("scope IN ('read', 'write')", name="scope"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String, unique=True)
    scope: Mapped[str] = mapped_column(String)
    label: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
