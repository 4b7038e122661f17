"""workers.waiting_since: when the worker's acquire tries started granting it nothing (fair share)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import server.db_types

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "workers",
        sa.Column("waiting_since", server.db_types.UTCDateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("waiting_since")
