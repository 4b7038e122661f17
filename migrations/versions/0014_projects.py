"""projects: several teams on one control plane (server/projects/). A `projects` table with
the `default` project, which every existing run, sweep and dataset joins (their project_id
NOT NULL); workers, pool learners and registration tokens get a nullable project_id, NULL for
every existing one: the shared fleet, which serves every project.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 22:00:00.000000
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

import server.db_types

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# server/models/project.py DEFAULT_PROJECT_ID, written out: a migration does not follow the code.
DEFAULT_PROJECT_ID = "00000000-0000-0000-0000-00000000d3fa"
OWNED = ("runs", "sweeps", "datasets")  # every row belongs to a project
SHARED = ("workers", "pool_learners", "tokens")  # NULL: the shared fleet


def upgrade() -> None:
    projects = op.create_table(
        "projects",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column(
            "created_at",
            server.db_types.UTCDateTime(timezone=True),
            server_default=server.db_types.db_now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("name", name=op.f("uq_projects_name")),
    )
    assert projects is not None
    op.bulk_insert(projects, [{"id": uuid.UUID(DEFAULT_PROJECT_ID), "name": "default"}])
    for table in OWNED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("project_id", sa.Uuid(), nullable=True))
        rows = sa.table(table, sa.column("project_id", sa.Uuid()))
        op.execute(rows.update().values(project_id=uuid.UUID(DEFAULT_PROJECT_ID)))
        with op.batch_alter_table(table) as batch:
            batch.alter_column("project_id", existing_type=sa.Uuid(), nullable=False)
            _index_and_key(batch, table)
    for table in SHARED:
        with op.batch_alter_table(table) as batch:
            if table != "pool_learners":  # 0013 made it, without a foreign key
                batch.add_column(sa.Column("project_id", sa.Uuid(), nullable=True))
            _index_and_key(batch, table)


def _index_and_key(batch: BatchOperations, table: str) -> None:
    batch.create_index(batch.f(f"ix_{table}_project_id"), ["project_id"], unique=False)
    batch.create_foreign_key(
        batch.f(f"fk_{table}_project_id_projects"),
        "projects",
        ["project_id"],
        ["id"],
        ondelete="RESTRICT",
    )


def downgrade() -> None:
    for table in OWNED + SHARED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(batch.f(f"fk_{table}_project_id_projects"), type_="foreignkey")
            batch.drop_index(batch.f(f"ix_{table}_project_id"))
            if table != "pool_learners":
                batch.drop_column("project_id")
    op.drop_table("projects")
