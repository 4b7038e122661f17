from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from server.db_types import BigIntPK, JSONType, UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk
from server.models.project import DEFAULT_PROJECT_ID, Project


class Run(UUIDPk, CreatedAt, Base):
    __tablename__ = "runs"

    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(32), default="pending", index=True)
    # Deferred: an inline JSONL dataset makes it megabytes; hot paths read the parsed, cached
    # copy (server.runs.service.config_of) instead of loading it with every Run.
    config: Mapped[dict[str, Any]] = mapped_column(JSONType, deferred=True)
    base_model: Mapped[str] = mapped_column(String(500), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    current_version: Mapped[int] = mapped_column(Integer, default=0)
    tokenizer_fingerprint: Mapped[str | None] = mapped_column(String(128))
    # Monotonic source of fencing tokens for every grant on this run (leases and learner).
    fencing_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    # Admission control: groups leased, accepted or claimed and not yet consumed.
    groups_in_flight: Mapped[int] = mapped_column(Integer, default=0)
    # Re-queued prompt rows take positions below this (the front of the queue).
    queue_head: Mapped[int] = mapped_column(BigInteger, default=0)
    learner_fencing: Mapped[int | None] = mapped_column(BigInteger)
    learner_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    learner_attached_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_version_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_lease_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    spent_usd: Mapped[float] = mapped_column(Float, default=0.0)
    # The best version so far by the run's best metric and its figure (server/runs/best.py);
    # None until a version is ranked. Version 0 (the base model) can be it.
    best_version: Mapped[int | None] = mapped_column(Integer)
    best_value: Mapped[float | None] = mapped_column(Float)
    status_reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The stored dataset (uploaded or hf) the run's prompt rows come from; None for the
    # generator and inline kinds, whose rows are made at creation.
    dataset_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("datasets.id", ondelete="RESTRICT"), index=True
    )
    # The stored dataset of the run's eval block, when it names one (made into eval rows by the
    # run_prep job, like dataset_id's rows).
    eval_dataset_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("datasets.id", ondelete="RESTRICT"), index=True
    )
    # The sweep that made the run (server/sweeps/), the run's combination in it (its index,
    # from 0, in the order the sweep expands) and the overrides of the sweep's base config that
    # made its config ({field path: value}); None for a run made on its own.
    sweep_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("sweeps.id", ondelete="RESTRICT"), index=True
    )
    sweep_index: Mapped[int | None] = mapped_column(Integer)
    overrides: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # The pool learner that holds the run (server/learners/), None for a per-run learner; and
    # until when its take holds the run before it attaches (a take's hold, database time).
    pool_learner_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("pool_learners.id", ondelete="SET NULL"), index=True
    )
    pool_held_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Its project (server/projects/); the default project when created without one.
    project_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("projects.id", ondelete="RESTRICT"), index=True, default=DEFAULT_PROJECT_ID
    )
    # Loaded when read (listings show its name): one query per project in a session.
    project: Mapped[Project] = relationship(lazy="select")
    # The admin or project token that created it (a `ci` token may pause and cancel only the
    # runs it created: server/tokens/roles.py); None for one created before revision 0015.
    created_by_token_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("tokens.id", ondelete="SET NULL"), index=True
    )


class DatasetRow(Base):
    """One dataset row: the prompt workers see and the reference columns they never see."""

    __tablename__ = "dataset_rows"
    __table_args__ = (Index("ix_dataset_rows_run_index", "run_id", "row_index", unique=True),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    row_index: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[Any] = mapped_column(JSONType)
    reference: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)


class PromptRow(Base):
    """A dataset row in one epoch: the unit the queue leases, tracks and accounts for."""

    __tablename__ = "prompt_rows"
    __table_args__ = (
        Index("ix_prompt_rows_queue", "run_id", "state", "queue_pos"),
        Index("ix_prompt_rows_lease", "lease_id"),
        Index("ix_prompt_rows_batch", "batch_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    dataset_row_id: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("dataset_rows.id", ondelete="CASCADE")
    )
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    queue_pos: Mapped[int] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    drop_reason: Mapped[str | None] = mapped_column(String(64))
    last_requeue_reason: Mapped[str | None] = mapped_column(String(64))
    lease_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    consumed_version: Mapped[int | None] = mapped_column(Integer)
