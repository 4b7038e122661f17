"""sweeps: runs made at once from a base config and a grid or list of overrides
(server/sweeps/); runs.sweep_id, runs.sweep_index and runs.overrides (NULL for a run made on
its own)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import server.db_types

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("base_config", _JSON, nullable=False),
        sa.Column("grid", _JSON, nullable=True),
        sa.Column("n_runs", sa.Integer(), nullable=False),
        sa.Column(
            "created_at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("sweep_id", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("sweep_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("overrides", _JSON, nullable=True))
        batch.create_index(batch.f("ix_runs_sweep_id"), ["sweep_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_runs_sweep_id_sweeps"),
            "sweeps",
            ["sweep_id"],
            ["id"],
            ondelete="RESTRICT",
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(batch.f("fk_runs_sweep_id_sweeps"), type_="foreignkey")
        batch.drop_index(batch.f("ix_runs_sweep_id"))
        batch.drop_column("overrides")
        batch.drop_column("sweep_index")
        batch.drop_column("sweep_id")
    op.drop_table("sweeps")
