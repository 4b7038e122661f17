"""datasets: uploaded and Hugging Face datasets stored in the bucket; runs.dataset_id

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-12 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import server.db_types

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("bucket_key", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("row_count", sa.BigInteger(), nullable=True),
        sa.Column("columns", _JSON, nullable=True),
        sa.Column("fingerprint", sa.String(length=128), nullable=True),
        sa.Column("spec", _JSON, nullable=True),
        sa.Column("spec_key", sa.String(length=64), nullable=True),
        sa.Column("ready_at", server.db_types.UTCDateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    op.create_index(op.f("ix_datasets_status"), "datasets", ["status"], unique=False)
    op.create_index("ix_datasets_spec_key", "datasets", ["spec_key"], unique=True)
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("dataset_id", sa.Uuid(), nullable=True))
        batch.create_index(batch.f("ix_runs_dataset_id"), ["dataset_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_runs_dataset_id_datasets"),
            "datasets",
            ["dataset_id"],
            ["id"],
            ondelete="RESTRICT",
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(batch.f("fk_runs_dataset_id_datasets"), type_="foreignkey")
        batch.drop_index(batch.f("ix_runs_dataset_id"))
        batch.drop_column("dataset_id")
    op.drop_index("ix_datasets_spec_key", table_name="datasets")
    op.drop_index(op.f("ix_datasets_status"), table_name="datasets")
    op.drop_table("datasets")
