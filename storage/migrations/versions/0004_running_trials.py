"""Trials in flight are ours: a study's trials live in our tables alone, not in Optuna's.

A trial sent to a GPU takes its number in ``tuner_running_trials``; once measured it moves to
``tuner_trials``. Every measured trial of earlier versions is in ``tuner_trials`` already (they
were stored there before Optuna's copy was told), so nothing is carried over; Optuna's own tables
in the database are left as they were, and no longer read or written.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_running_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["tuner_studies.id"],
            name=op.f("fk_tuner_running_trials_study_id_tuner_studies"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_running_trials")),
        sa.UniqueConstraint(
            "study_id", "number", name=op.f("uq_tuner_running_trials_study_id")
        ),
    )


def downgrade() -> None:
    op.drop_table("tuner_running_trials")
