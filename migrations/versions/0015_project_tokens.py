"""project tokens: a token's role (server/tokens/roles.py; set on tokens of kind `project`,
NULL on every existing token), and the token that created each run and sweep (NULL for every
existing one).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CREATED = ("runs", "sweeps")


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("role", sa.String(length=16), nullable=True))
    for table in CREATED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("created_by_token_id", sa.Uuid(), nullable=True))
            batch.create_index(
                batch.f(f"ix_{table}_created_by_token_id"), ["created_by_token_id"], unique=False
            )
            batch.create_foreign_key(
                batch.f(f"fk_{table}_created_by_token_id_tokens"),
                "tokens",
                ["created_by_token_id"],
                ["id"],
                ondelete="SET NULL",
            )


def downgrade() -> None:
    for table in CREATED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(
                batch.f(f"fk_{table}_created_by_token_id_tokens"), type_="foreignkey"
            )
            batch.drop_index(batch.f(f"ix_{table}_created_by_token_id"))
            batch.drop_column("created_by_token_id")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("role")
