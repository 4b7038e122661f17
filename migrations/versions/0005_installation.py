"""installation: the database's id and the bucket it serves (one row)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "installation",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("database_id", sa.Uuid(), nullable=False),
        sa.Column("bucket_url", sa.String(length=2000), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_installation")),
    )


def downgrade() -> None:
    op.drop_table("installation")
