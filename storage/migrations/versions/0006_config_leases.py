"""A lease per config: a study's running trials hold their config, and measured trials name it.

Coordinators sharing a study (several processes, or several machines on PostgreSQL) claim a
config in the database before measuring it (``Repository.claim_trial``). ``config_key`` (the
SHA-256 of the config's canonical JSON, ``storage.records.config_key``) is unique per study among
the running trials, so two claims of one config cannot both succeed; measured trials carry it
too (indexed), so a claim of a config measured already is refused in the same transaction.
``heartbeat_at`` is when the owner last renewed its leases: one not renewed for
``storage.records.LEASE_TTL_S`` is stale (its coordinator was killed) and is taken over.

Rows of earlier versions get their key from their params and their start as heartbeat; where a
config was running twice (the bug this fixes), only its lowest-numbered running row is kept.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key(params: object) -> str:
    """storage.records.config_key as of this revision (kept here: a migration never changes)."""
    if isinstance(params, str):
        params = json.loads(params)
    return hashlib.sha256(json.dumps(dict(params), sort_keys=True).encode()).hexdigest()  # type: ignore[arg-type]


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("config_key", sa.String(), nullable=True))
    for trial_id, params in bind.execute(sa.text("SELECT id, params FROM tuner_trials")).fetchall():
        bind.execute(sa.text("UPDATE tuner_trials SET config_key = :key WHERE id = :id"),
                     {"key": _key(params), "id": trial_id})
    with op.batch_alter_table("tuner_trials") as batch:
        batch.alter_column("config_key", existing_type=sa.String(), nullable=False)
        batch.create_index(op.f("ix_tuner_trials_config_key"), ["config_key", "study_id"])

    with op.batch_alter_table("tuner_running_trials") as batch:
        batch.add_column(sa.Column("config_key", sa.String(), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(), nullable=True))
    seen: set[tuple[int, str]] = set()
    rows = bind.execute(sa.text(
        "SELECT id, study_id, params FROM tuner_running_trials ORDER BY study_id, number")).fetchall()
    for row_id, study_id, params in rows:
        key = _key(params)
        if (study_id, key) in seen:
            bind.execute(sa.text("DELETE FROM tuner_running_trials WHERE id = :id"), {"id": row_id})
            continue
        seen.add((study_id, key))
        bind.execute(sa.text("UPDATE tuner_running_trials SET config_key = :key, heartbeat_at = started_at "
                             "WHERE id = :id"), {"key": key, "id": row_id})
    with op.batch_alter_table("tuner_running_trials") as batch:
        batch.alter_column("config_key", existing_type=sa.String(), nullable=False)
        batch.alter_column("heartbeat_at", existing_type=sa.DateTime(), nullable=False)
        batch.create_unique_constraint(op.f("uq_tuner_running_trials_config_key"), ["config_key", "study_id"])


def downgrade() -> None:
    with op.batch_alter_table("tuner_running_trials") as batch:
        batch.drop_constraint(op.f("uq_tuner_running_trials_config_key"), type_="unique")
        batch.drop_column("heartbeat_at")
        batch.drop_column("config_key")
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_index(op.f("ix_tuner_trials_config_key"))
        batch.drop_column("config_key")
