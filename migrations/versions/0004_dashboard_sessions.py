"""dashboard_sessions: server-side dashboard logins, so logout and token revocation end them

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import server.db_types

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("token_id", sa.Uuid(), nullable=False),
        sa.Column("expires_at", server.db_types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", server.db_types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column(
            "created_at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["tokens.id"],
            name=op.f("fk_dashboard_sessions_token_id_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dashboard_sessions")),
    )
    op.create_index(
        op.f("ix_dashboard_sessions_token_id"), "dashboard_sessions", ["token_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_dashboard_sessions_token_id"), table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
