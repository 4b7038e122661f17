from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import JSONType, UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk


class Lease(UUIDPk, CreatedAt, Base):
    __tablename__ = "leases"
    __table_args__ = (
        Index("ix_leases_run_state", "run_id", "state"),
        Index("ix_leases_worker_state", "worker_id", "state"),
        Index("ix_leases_state_expires", "state", "expires_at"),
    )

    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    worker_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("workers.id"))
    adapter_version: Mapped[int] = mapped_column(Integer)
    fencing: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default="active")
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(BigInteger)
    n_prompts: Mapped[int] = mapped_column(Integer)
    group_size: Mapped[int] = mapped_column(Integer)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # train, or eval (pinned to adapter_version; eval's own bound; never aborted as stale)
    kind: Mapped[str] = mapped_column(String(8), default="train", server_default="train")


class RolloutBatch(UUIDPk, CreatedAt, Base):
    __tablename__ = "rollout_batches"
    __table_args__ = (Index("ix_rollout_batches_run_state", "run_id", "state", "adapter_version"),)

    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    lease_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("leases.id"), unique=True)
    worker_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("workers.id"))
    adapter_version: Mapped[int] = mapped_column(Integer)
    bucket_key: Mapped[str] = mapped_column(String(1000))
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    n_samples: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)
    n_groups: Mapped[int] = mapped_column(Integer)
    tokenizer_fingerprint: Mapped[str | None] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    reject_reason: Mapped[str | None] = mapped_column(String(64))
    reject_detail: Mapped[str | None] = mapped_column(Text)
    staleness: Mapped[int | None] = mapped_column(Integer)
    claimed_fencing: Mapped[int | None] = mapped_column(BigInteger)
    # The version the claim will train the batch into (invariant 5): its staleness is measured
    # from target_version - 1, and publish consumes it into no later version.
    target_version: Mapped[int | None] = mapped_column(Integer)
    consumed_version: Mapped[int | None] = mapped_column(Integer)
    generation_seconds: Mapped[float | None] = mapped_column(Float)
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # train, or eval: claimed through evals/claim only, scored and never trained on
    kind: Mapped[str] = mapped_column(String(8), default="train", server_default="train")
