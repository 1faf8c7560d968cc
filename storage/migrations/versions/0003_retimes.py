"""Re-timings: a study's fastest trials timed again interleaved, and the best row pointing at one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_retimes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("retiming", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("iqr_ms", sa.Float(), nullable=True),
        sa.Column("min_ms", sa.Float(), nullable=True),
        sa.Column("max_ms", sa.Float(), nullable=True),
        sa.Column("repetitions", sa.Integer(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("failure", sa.String(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("replayed", sa.Boolean(), nullable=False),
        sa.Column("gpu_state", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint(
            "failure IS NOT NULL OR (rank IS NOT NULL AND median_ms IS NOT NULL)",
            name=op.f("ck_tuner_retimes_ok_ranked"),
        ),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["tuner_studies.id"],
            name=op.f("fk_tuner_retimes_study_id_tuner_studies"),
        ),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["tuner_trials.id"],
            name=op.f("fk_tuner_retimes_trial_id_tuner_trials"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_retimes")),
        sa.UniqueConstraint(
            "study_id", "retiming", "trial_id", name=op.f("uq_tuner_retimes_study_id")
        ),
    )
    with op.batch_alter_table("tuner_best") as batch:
        batch.add_column(sa.Column("retime_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_tuner_best_retime_id_tuner_retimes"), "tuner_retimes", ["retime_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("tuner_best") as batch:
        batch.drop_constraint(op.f("fk_tuner_best_retime_id_tuner_retimes"), type_="foreignkey")
        batch.drop_column("retime_id")
    op.drop_table("tuner_retimes")
