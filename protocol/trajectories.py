"""One rollout as a trajectory: the tokens exactly as the engine saw and produced them.

A trajectory is a flat list of token ids cut into contiguous spans
(docs/architecture/environments.md, "Environments and trajectories"): first the prompt (the chat
template rendered once), then alternately a model turn (the tokens the engine sampled, EOS included)
and an environment turn (tool results, game answers, the next assistant header), each environment
turn tokenized on its own and appended — the conversation is never re-rendered afterwards. The loss
mask is 1 exactly on model-turn tokens; the behaviour log-probs are given exactly there and None
elsewhere. The transcript holds the same conversation as messages, for rewards and people.

`validate_trajectory` is the one check of these invariants; it raises `TrajectoryError` with the
first broken rule.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SpanKind = Literal["prompt", "model", "environment"]
StopReason = Literal[
    "done",  # the model answered (no tool call), or the game ended
    "length",  # a model turn reached the per-turn max_new_tokens without EOS
    "max_turns",  # the model wanted another turn after its last allowed one
    "token_budget",  # max_total_tokens left no room for the next turn
    "tool_timeout",  # a tool call outlived its timeout (killed)
]
MessageKind = Literal["prompt", "model", "tool_result", "tool_error", "feedback"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TurnSpan(_Frozen):
    """Tokens [start, end) of the trajectory and who produced them."""

    kind: SpanKind = Field(description="prompt, model (sampled: trained) or environment.")
    start: int = Field(ge=0, description="First token index of the span.")
    end: int = Field(ge=0, description="One past the last token index of the span.")


class ToolCall(_Frozen):
    """A tool call the environment parsed from a model turn."""

    name: str = Field(description="The tool's name as the model wrote it.")
    arguments: dict[str, Any] = Field(description="The arguments object as the model wrote it.")


class TranscriptMessage(_Frozen):
    """One message of the conversation, as given to the chat template."""

    role: str = Field(description="The chat-template role: system, user, assistant or tool.")
    content: str = Field(description="The message text (a model turn: its decoded tokens).")
    kind: MessageKind = Field(
        description="prompt (the row's messages), model, tool_result, tool_error (a malformed "
        "or failed call) or feedback (the environment's own user turn)."
    )
    name: str | None = Field(None, description="The tool's name, on tool_result/tool_error.")
    tool_calls: list[ToolCall] = Field(
        default_factory=list, description="Tool calls parsed from a model message."
    )


class Trajectory(_Frozen):
    """One rollout, token-exact."""

    token_ids: list[int] = Field(description="Every token, prompt first, as the engine saw them.")
    loss_mask: list[int] = Field(description="1 on model-turn tokens (trained), else 0.")
    logprobs: list[float | None] = Field(
        description="Behaviour log-prob of each token where loss_mask is 1, None elsewhere."
    )
    spans: list[TurnSpan] = Field(description="Contiguous turn boundaries covering every token.")
    messages: list[TranscriptMessage] = Field(description="The conversation as messages.")
    stop_reason: StopReason = Field(description="Why the rollout ended.")
    tool_calls: int = Field(
        0,
        ge=0,
        description="Tool calls (well-formed or not) of the model turns the environment "
        "answered; calls of a last turn that ended the rollout (max_turns) are not run.",
    )
    tool_errors: int = Field(0, ge=0, description="Of them, malformed, failed or timed out.")
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="The environment's own outcome data for rewards (guess_number: the secret "
        "and whether it was found); never trained on.",
    )

    @property
    def prompt_tokens(self) -> int:
        return self.spans[0].end if self.spans else 0

    @property
    def model_turns(self) -> int:
        return sum(span.kind == "model" for span in self.spans)

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss counts: the loss normalisers count these only."""
        return sum(self.loss_mask)

    def completion_text(self) -> str:
        """The text of the model turns, in order (what a single-turn reward reads)."""
        return "".join(m.content for m in self.messages if m.kind == "model")


class TrajectoryError(ValueError):
    """A trajectory that breaks a format rule; the message says which."""


def validate_trajectory(
    t: Trajectory, max_total_tokens: int | None = None, *, scored_only: bool = False
) -> None:
    """Check lengths, spans, mask, log-prob alignment and counts; TrajectoryError if broken.
    `scored_only` (an eval trajectory, never trained on): log-probs must be None everywhere."""
    n = len(t.token_ids)
    _check_lengths(t, n, max_total_tokens)
    _check_spans(t, n)
    _check_mask_and_logprobs(t, scored_only)
    _check_transcript(t)


def _check_lengths(t: Trajectory, n: int, max_total_tokens: int | None) -> None:
    if len(t.loss_mask) != n or len(t.logprobs) != n:
        raise TrajectoryError(
            f"loss_mask ({len(t.loss_mask)}) and logprobs ({len(t.logprobs)}) must have one "
            f"entry per token ({n})"
        )
    if max_total_tokens is not None and n > max_total_tokens:
        raise TrajectoryError(f"{n} tokens exceed max_total_tokens {max_total_tokens}")
    if any(tok < 0 for tok in t.token_ids):
        raise TrajectoryError("token ids must be non-negative")


def _check_spans(t: Trajectory, n: int) -> None:
    if not t.spans or t.spans[0].kind != "prompt" or t.spans[0].start != 0:
        raise TrajectoryError("spans must start with the prompt span at token 0")
    if sum(s.kind == "prompt" for s in t.spans) != 1:
        raise TrajectoryError("spans must hold exactly one prompt span")
    position, previous = 0, None
    for i, span in enumerate(t.spans):
        if span.start != position or span.end <= span.start:
            raise TrajectoryError(
                f"span {i} ({span.kind} {span.start}:{span.end}) must be non-empty and start "
                f"where the previous one ends ({position})"
            )
        if previous is not None and span.kind == previous:
            raise TrajectoryError(f"span {i}: two {span.kind} spans in a row")
        position, previous = span.end, span.kind
    if position != n:
        raise TrajectoryError(f"spans cover {position} tokens, the trajectory has {n}")
    if t.model_turns == 0:
        raise TrajectoryError("a trajectory needs at least one model span")


def _check_mask_and_logprobs(t: Trajectory, scored_only: bool = False) -> None:
    if scored_only and any(lp is not None for lp in t.logprobs):
        raise TrajectoryError("an eval trajectory carries no behaviour log-probs")
    for span in t.spans:
        want = 1 if span.kind == "model" else 0
        for i in range(span.start, span.end):
            if t.loss_mask[i] != want:
                raise TrajectoryError(
                    f"loss_mask[{i}] is {t.loss_mask[i]} in a {span.kind} span (must be {want})"
                )
            lp = t.logprobs[i]
            if scored_only:
                continue
            if want and (lp is None or not math.isfinite(lp) or lp > 0):
                raise TrajectoryError(f"logprobs[{i}] must be a finite log-prob <= 0 (got {lp})")
            if not want and lp is not None:
                raise TrajectoryError(f"logprobs[{i}] must be None outside model spans")


def _check_transcript(t: Trajectory) -> None:
    model_messages = sum(m.kind == "model" for m in t.messages)
    if model_messages != t.model_turns:
        raise TrajectoryError(
            f"the transcript has {model_messages} model messages for {t.model_turns} model spans"
        )
    if t.tool_errors > t.tool_calls:
        raise TrajectoryError(
            f"tool_errors ({t.tool_errors}) cannot exceed tool_calls ({t.tool_calls})"
        )
