"""runs.best_version, runs.best_value: the run's best version by its best metric and that
version's figure (server/runs/best.py); NULL until a version is ranked

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 11:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("best_version", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("best_value", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("best_value")
        batch.drop_column("best_version")
