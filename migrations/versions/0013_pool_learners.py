"""pool learners: learners that start without a run, register with a registration token and
take runs that need a learner (server/learners/); runs.pool_learner_id (the run's pool learner,
NULL for a per-run learner) and runs.pool_held_until (a take's hold until its attach);
cost_records.pool_learner_id (a pool learner's time)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import server.db_types

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pool_learners",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("tokenizer_fingerprint", sa.String(length=128), nullable=False),
        sa.Column("max_runs", sa.Integer(), nullable=False),
        sa.Column("memory_budget_gb", sa.Float(), nullable=True),
        sa.Column("gpu_type", sa.String(length=100), nullable=True),
        sa.Column("price_per_hour", sa.Float(), nullable=True),
        sa.Column("project_id", sa.Uuid(), nullable=True),
        sa.Column("token_id", sa.Uuid(), nullable=True),
        sa.Column("last_seen_at", server.db_types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", server.db_types.UTCDateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["tokens.id"],
            name=op.f("fk_pool_learners_token_id_tokens"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pool_learners")),
    )
    op.create_index(op.f("ix_pool_learners_model"), "pool_learners", ["model"], unique=False)
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("pool_learner_id", sa.Uuid(), nullable=True))
        batch.add_column(
            sa.Column("pool_held_until", server.db_types.UTCDateTime(timezone=True), nullable=True)
        )
        batch.create_index(batch.f("ix_runs_pool_learner_id"), ["pool_learner_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_runs_pool_learner_id_pool_learners"),
            "pool_learners",
            ["pool_learner_id"],
            ["id"],
            ondelete="SET NULL",
        )
    with op.batch_alter_table("cost_records") as batch:
        batch.add_column(sa.Column("pool_learner_id", sa.Uuid(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cost_records") as batch:
        batch.drop_column("pool_learner_id")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(batch.f("fk_runs_pool_learner_id_pool_learners"), type_="foreignkey")
        batch.drop_index(batch.f("ix_runs_pool_learner_id"))
        batch.drop_column("pool_held_until")
        batch.drop_column("pool_learner_id")
    op.drop_index(op.f("ix_pool_learners_model"), table_name="pool_learners")
    op.drop_table("pool_learners")
