"""idempotency_keys (the answer of each state-changing call made under an Idempotency-Key) and
idempotency_watermarks (per caller, the latest key time retention let go of)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import server.db_types

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_TIME = server.db_types.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("key", sa.Uuid(), nullable=False),
        sa.Column("key_time", _TIME, nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column("headers", _JSON, nullable=True),
        sa.Column(
            "created_at", _TIME, server_default=server.db_types.db_now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("scope", "key", name=op.f("pk_idempotency_keys")),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])
    op.create_table(
        "idempotency_watermarks",
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("key_time", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_idempotency_watermarks")),
    )


def downgrade() -> None:
    op.drop_table("idempotency_watermarks")
    op.drop_index("ix_idempotency_keys_created_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
