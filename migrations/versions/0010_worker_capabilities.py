"""workers.capabilities: what a worker's engine can load (protocol/capabilities.py), declared at
registration and with each acquire; NULL (old rows, old workers): it serves every run

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 07:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.add_column("workers", sa.Column("capabilities", _JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("capabilities")
