"""evaluation during training: eval_rows, eval_items, eval_results; leases.kind and
rollout_batches.kind; runs.eval_dataset_id (a stored eval dataset)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import server.db_types

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["runs.id"], name=op.f(f"fk_{table}_run_id_runs"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "eval_rows",
        sa.Column("id", _BIGINT, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("prompt", _JSON, nullable=False),
        sa.Column("reference", _JSON, nullable=False),
        _run_fk("eval_rows"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_rows")),
    )
    op.create_index("ix_eval_rows_run_index", "eval_rows", ["run_id", "row_index"], unique=True)
    op.create_table(
        "eval_items",
        sa.Column("id", _BIGINT, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("eval_row_id", _BIGINT, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_id", sa.Uuid(), nullable=True),
        sa.Column("batch_id", sa.Uuid(), nullable=True),
        sa.Column("reward_sum", sa.Float(), nullable=True),
        sa.Column("accurate", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["eval_row_id"],
            ["eval_rows.id"],
            name=op.f("fk_eval_items_eval_row_id_eval_rows"),
            ondelete="CASCADE",
        ),
        _run_fk("eval_items"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_items")),
    )
    op.create_index("ix_eval_items_queue", "eval_items", ["run_id", "state", "version"])
    op.create_index("ix_eval_items_lease", "eval_items", ["lease_id"])
    op.create_index("ix_eval_items_batch", "eval_items", ["batch_id"])
    op.create_table(
        "eval_results",
        sa.Column("id", _BIGINT, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("n_prompts", sa.Integer(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("mean_reward", sa.Float(), nullable=True),
        sa.Column("accuracy", sa.Float(), nullable=True),
        sa.Column("pass_at_n", sa.Float(), nullable=True),
        sa.Column("scored_at", server.db_types.UTCDateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        _run_fk("eval_results"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_results")),
    )
    op.create_index(
        "ix_eval_results_run_version", "eval_results", ["run_id", "version"], unique=True
    )
    op.add_column(
        "leases", sa.Column("kind", sa.String(length=8), server_default="train", nullable=False)
    )
    op.add_column(
        "rollout_batches",
        sa.Column("kind", sa.String(length=8), server_default="train", nullable=False),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("eval_dataset_id", sa.Uuid(), nullable=True))
        batch.create_index(batch.f("ix_runs_eval_dataset_id"), ["eval_dataset_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_runs_eval_dataset_id_datasets"),
            "datasets",
            ["eval_dataset_id"],
            ["id"],
            ondelete="RESTRICT",
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(batch.f("fk_runs_eval_dataset_id_datasets"), type_="foreignkey")
        batch.drop_index(batch.f("ix_runs_eval_dataset_id"))
        batch.drop_column("eval_dataset_id")
    with op.batch_alter_table("rollout_batches") as batch:
        batch.drop_column("kind")
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("kind")
    op.drop_table("eval_results")
    op.drop_table("eval_items")
    op.drop_table("eval_rows")
