"""Problems keyed by their family's flags: the ``causal`` column becomes a ``flags`` JSON object.

Before this revision a problem was (family, shape, dtype, causal), causal being the one flag of
the one family there was. Attention's rows carry it over as {"causal": true|false} (every flag of
a problem is stored, defaults included); another family's rows as {} (none had it set) or
{"causal": true}.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FAMILY_WITH_CAUSAL = "attention"


def _text(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def upgrade() -> None:
    with op.batch_alter_table("tuner_problems") as batch:
        batch.add_column(sa.Column("flags", sa.Text(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        "SELECT p.id, p.causal, f.name FROM tuner_problems p JOIN tuner_families f ON f.id = p.family_id"
    )).fetchall()
    for problem_id, causal, family in rows:
        flags = {"causal": bool(causal)} if family == FAMILY_WITH_CAUSAL or causal else {}
        bind.execute(sa.text("UPDATE tuner_problems SET flags = :flags WHERE id = :id"),
                     {"flags": _text(flags), "id": problem_id})
    with op.batch_alter_table("tuner_problems") as batch:
        batch.drop_constraint(op.f("uq_tuner_problems_family_id"), type_="unique")
        batch.drop_column("causal")
        batch.alter_column("flags", existing_type=sa.Text(), nullable=False)
        batch.create_unique_constraint(op.f("uq_tuner_problems_family_id"), ["family_id", "shape", "dtype", "flags"])


def downgrade() -> None:
    with op.batch_alter_table("tuner_problems") as batch:
        batch.add_column(sa.Column("causal", sa.Boolean(), nullable=True))
    bind = op.get_bind()
    for problem_id, flags in bind.execute(sa.text("SELECT id, flags FROM tuner_problems")).fetchall():
        causal = bool(json.loads(flags or "{}").get("causal", False))
        bind.execute(sa.text("UPDATE tuner_problems SET causal = :causal WHERE id = :id"),
                     {"causal": causal, "id": problem_id})
    with op.batch_alter_table("tuner_problems") as batch:
        batch.drop_constraint(op.f("uq_tuner_problems_family_id"), type_="unique")
        batch.drop_column("flags")
        batch.alter_column("causal", existing_type=sa.Boolean(), nullable=False)
        batch.create_unique_constraint(op.f("uq_tuner_problems_family_id"), ["family_id", "shape", "dtype", "causal"])
