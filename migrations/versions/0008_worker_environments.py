"""workers.environments (what a worker declared it can run; old rows: single_turn) and
workers.trusted (an admin's mark; grants of runs whose environment requires a trusted worker)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.add_column(
        "workers",
        sa.Column("environments", _JSON, server_default='["single_turn"]', nullable=False),
    )
    op.add_column(
        "workers", sa.Column("trusted", sa.Boolean(), server_default=sa.false(), nullable=False)
    )


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("trusted")
        batch.drop_column("environments")
