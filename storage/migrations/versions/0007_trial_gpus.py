"""Which GPU measured a trial, and its time on the study's reference GPU.

``gpu_uuid`` and ``gpu_index`` name the GPU (its UUID, and its index on its machine as NVML
numbers it); ``normalized_ms`` is the trial's median scaled by that GPU's ratio to the study's
reference GPU at the time (``gpu_ratio``), so that the timings of several GPUs are one set; the
raw ``median_ms`` is never altered. Trials of earlier versions keep them empty (one GPU, or
unknown), and are ranked by their median as before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("gpu_uuid", sa.String(), nullable=True))
        batch.add_column(sa.Column("gpu_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("normalized_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gpu_ratio", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("gpu_ratio")
        batch.drop_column("normalized_ms")
        batch.drop_column("gpu_index")
        batch.drop_column("gpu_uuid")
