"""rollout_batches.target_version: the version a claim will train the batch into

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-08 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("rollout_batches", sa.Column("target_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_batches") as batch:
        batch.drop_column("target_version")
