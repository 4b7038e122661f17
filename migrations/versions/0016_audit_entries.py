"""audit entries: who changed what, when, from where, and the refused calls (server/audit/).
One table, no foreign keys (an entry outlives the token, project and object it names).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-08 00:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import server.db_types

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        sa.Column("token_id", sa.Uuid(), nullable=True),
        sa.Column("token_name", sa.String(length=200), nullable=True),
        sa.Column("token_prefix", sa.String(length=32), nullable=True),
        sa.Column("role", sa.String(length=32), nullable=True),
        sa.Column("project_id", sa.Uuid(), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object_type", sa.String(length=32), nullable=True),
        sa.Column("object_id", sa.String(length=64), nullable=True),
        sa.Column("source", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_entries")),
    )
    op.create_index("ix_audit_entries_at_id", "audit_entries", ["at", "id"], unique=False)
    op.create_index(
        "ix_audit_entries_project_at", "audit_entries", ["project_id", "at"], unique=False
    )
    op.create_index(
        "ix_audit_entries_source_prefix_at",
        "audit_entries",
        ["source", "token_prefix", "at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_audit_entries_source_prefix_at", table_name="audit_entries")
    op.drop_index("ix_audit_entries_project_at", table_name="audit_entries")
    op.drop_index("ix_audit_entries_at_id", table_name="audit_entries")
    op.drop_table("audit_entries")
