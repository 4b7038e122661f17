"""Admin read models of the learner feature (run metrics, prompt ledger)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class LearnerPoint(BaseModel):
    step: int = Field(description="Learner step (or proxy interval index).")
    version: int | None = Field(description="Adapter version the point belongs to.")
    values: dict[str, Any] = Field(description="Named metric values.")
    created_at: datetime | None = Field(description="When the point was stored.")


class ProxyStats(BaseModel):
    """Rollout-proxy figures computed on read from batches and leases."""

    batches_by_state: dict[str, int] = Field(description="Batches per state.")
    batches_accepted: int = Field(description="Batches that passed `complete`.")
    rejected_by_reason: dict[str, int] = Field(description="Rejected batches per reason.")
    samples_generated: int = Field(
        description="Samples in uploaded training batches plus in leases aborted as stale "
        "(eval batches are not counted)."
    )
    samples_rejected_stale: int = Field(description="Samples in batches rejected as stale.")
    samples_aborted: int = Field(
        description="Samples of leases aborted as stale (not those aborted because the run "
        "paused, was cancelled or completed)."
    )
    stale_waste: float = Field(
        description="(samples rejected stale + samples aborted) / samples generated "
        "(docs/architecture/contract.md, invariant 16)."
    )
    staleness_histogram: dict[str, int] = Field(description="Consumed batches per staleness.")
    by_adapter_version: list[dict[str, int]] = Field(
        description="Per generating adapter version: batches, samples, and counts per state."
    )


class RunMetrics(BaseModel):
    run_id: uuid.UUID = Field(description="The run.")
    current_version: int = Field(description="The run's last published version.")
    learner: list[LearnerPoint] = Field(description="Learner series (since_step onwards).")
    proxy_points: list[LearnerPoint] = Field(description="Stored proxy interval points.")
    proxy: ProxyStats = Field(description="Proxy figures computed now.")


class EpochLedger(BaseModel):
    epoch: int = Field(description="Epoch number.")
    total: int = Field(description="Prompt rows of this epoch.")
    by_state: dict[str, int] = Field(description="Rows per state.")
    dropped_by_reason: dict[str, int] = Field(description="Dropped rows per drop reason.")
    closed: bool = Field(description="Every row of the epoch consumed or dropped.")


class Ledger(BaseModel):
    """Where every prompt row of a run is (invariant 12)."""

    run_id: uuid.UUID = Field(description="The run.")
    run_status: str = Field(description="The run's status.")
    total: int = Field(description="Prompt rows of all epochs.")
    by_state: dict[str, int] = Field(description="Rows per state.")
    dropped_by_reason: dict[str, int] = Field(description="Dropped rows per drop reason.")
    epochs: list[EpochLedger] = Field(description="The same per epoch.")
    consumed_without_version: int = Field(description="Consumed rows naming no version (0).")
    balanced: bool = Field(
        description="Every row consumed once or dropped with a reason, and nothing else."
    )


class SampleSpan(BaseModel):
    kind: str = Field(description="prompt, model (trained) or environment.")
    start: int = Field(description="First token index.")
    end: int = Field(description="One past the last token index.")
    tokens: int = Field(description="end − start.")
    trained: bool = Field(description="Whether the loss covers these tokens (model spans).")


class SampleToolCall(BaseModel):
    name: str = Field(description="The tool's name as the model wrote it.")
    arguments: dict[str, Any] = Field(description="The arguments as the model wrote them.")


class SampleMessage(BaseModel):
    role: str = Field(description="The chat-template role.")
    kind: str = Field(description="prompt, model, tool_result, tool_error or feedback.")
    name: str | None = Field(description="The tool's name on tool_result/tool_error.")
    content: str = Field(description="The text, cut at the sample's per-message bound.")
    truncated: bool = Field(description="Whether `content` was cut.")
    trained: bool = Field(description="Model messages: their tokens are trained.")
    tool_calls: list[SampleToolCall] = Field(description="Tool calls parsed from a model turn.")


class TrajectorySampleOut(BaseModel):
    """One trajectory of a format 2 batch, read from the store
    (docs/architecture/environments.md)."""

    run_id: uuid.UUID = Field(description="The run.")
    batch_id: uuid.UUID = Field(description="The batch read.")
    batch_state: str = Field(description="The batch's state (consumed, accepted, …).")
    adapter_version: int = Field(description="The adapter version it was rolled out with.")
    row: int = Field(description="The row shown (rows sorted by prompt row, group index).")
    rows: int = Field(description="Trajectories in the batch.")
    prompt_row_id: int = Field(description="The prompt row.")
    group_index: int = Field(description="The trajectory's index in its group.")
    stop_reason: str = Field(description="Why the rollout ended.")
    tool_calls: int = Field(description="Tool calls the model made.")
    tool_errors: int = Field(description="Tool calls that failed or were malformed.")
    total_tokens: int = Field(description="Tokens of the whole trajectory.")
    trained_tokens: int = Field(description="Tokens in model spans (the loss covers them).")
    spans: list[SampleSpan] = Field(description="Turn boundaries in token order.")
    messages: list[SampleMessage] = Field(description="The transcript in order.")
    info: dict[str, Any] = Field(description="The environment's outcome (never trained).")
    transcript_bytes: int | None = Field(
        description="The stored transcript's size in bytes; null when it was not decoded (the "
        "transcripts of its row group are over the view's 64 MiB decode bound)."
    )
    transcript_truncated: bool = Field(
        description="Whether the transcript was cut: over the view's per-transcript bound (1 MiB) "
        "only the messages wholly within its first MiB are in `messages`; not decoded, none."
    )
    info_truncated: bool = Field(
        description="Whether `info` was over the same bounds: then it is left empty."
    )
