"""The eval ledger (docs/architecture/run-lifecycle.md, "Evaluation during training"): the eval
dataset's rows, one item per (version, eval row) to sample, and one result row per evaluated
version."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import BigIntPK, JSONType, UTCDateTime
from server.models.base import Base, CreatedAt


class EvalRow(Base):
    """One held-out prompt with its reference columns (only the learner's rewards see them)."""

    __tablename__ = "eval_rows"
    __table_args__ = (Index("ix_eval_rows_run_index", "run_id", "row_index", unique=True),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    row_index: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[Any] = mapped_column(JSONType)
    reference: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)


class EvalItem(Base):
    """One eval row to sample n times with one version: queued -> leased -> uploaded -> scored
    (leased and uploaded go back to queued when their lease or batch is lost; dropped after
    max_attempts)."""

    __tablename__ = "eval_items"
    __table_args__ = (
        Index("ix_eval_items_queue", "run_id", "state", "version"),
        Index("ix_eval_items_lease", "lease_id"),
        Index("ix_eval_items_batch", "batch_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    eval_row_id: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("eval_rows.id", ondelete="CASCADE")
    )
    state: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # filled when scored: the n samples' summed reward, accurate samples
    reward_sum: Mapped[float | None] = mapped_column(Float)
    accurate: Mapped[int | None] = mapped_column(Integer)


class EvalResult(CreatedAt, Base):
    """One evaluated version: pending until every item is scored (or dropped), then done with
    its aggregates."""

    __tablename__ = "eval_results"
    __table_args__ = (Index("ix_eval_results_run_version", "run_id", "version", unique=True),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending | done
    n_prompts: Mapped[int] = mapped_column(Integer, default=0)
    n_samples: Mapped[int] = mapped_column(Integer, default=0)
    mean_reward: Mapped[float | None] = mapped_column(Float)
    accuracy: Mapped[float | None] = mapped_column(Float)
    pass_at_n: Mapped[float | None] = mapped_column(Float)
    scored_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
