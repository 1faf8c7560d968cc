"""Jobs submitted to ``tuner serve``, their problems, and the server's API tokens.

A job is a family's problems, each to be tuned to a budget of trials, with a priority; a
scheduler (``tuner serve --run-jobs``) runs them through the same studies as ``tuner tune``.
A token is stored as the SHA-256 of its text, with its scope (read or write).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("served_at", sa.DateTime(), nullable=True),
        sa.Column("runner", sa.String(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')",
                           name=op.f("ck_tuner_jobs_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_jobs")),
    )
    op.create_index(op.f("ix_tuner_jobs_state"), "tuner_jobs", ["state", "priority"])
    op.create_table(
        "tuner_job_problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("shape", sa.Text(), nullable=False),
        sa.Column("dtype", sa.String(), nullable=False),
        sa.Column("flags", sa.Text(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("study", sa.String(), nullable=True),
        sa.CheckConstraint("state IN ('waiting', 'done', 'failed')", name=op.f("ck_tuner_job_problems_state")),
        sa.ForeignKeyConstraint(["job_id"], ["tuner_jobs.id"],
                                name=op.f("fk_tuner_job_problems_job_id_tuner_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_job_problems")),
        sa.UniqueConstraint("job_id", "position", name=op.f("uq_tuner_job_problems_job_id")),
    )
    op.create_table(
        "tuner_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("scope", sa.String(), nullable=False),
        sa.Column("label", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("scope IN ('read', 'write')", name=op.f("ck_tuner_tokens_scope")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_tuner_tokens_digest")),
    )


def downgrade() -> None:
    op.drop_table("tuner_tokens")
    op.drop_table("tuner_job_problems")
    op.drop_index(op.f("ix_tuner_jobs_state"), table_name="tuner_jobs")
    op.drop_table("tuner_jobs")
