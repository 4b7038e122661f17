"""The environment runtime: a turn-by-turn engine protocol and the trajectory being built.

An environment (`Environment.rollout`) drives a `TurnEngine` token-in, token-out: it gives the
engine every token of the trajectory so far and appends what the engine returns, so the token
ids of a trajectory are by construction exactly those the engine saw and produced. A
`Conversation` keeps those tokens, the loss mask, the behaviour log-probs, the turn spans and
the transcript in step, and enforces the token budget (lm/chat_turns.py says how environment
turns are tokenized).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, Protocol

from lm.chat_turns import encode_text, environment_segment, prompt_ids
from protocol.trajectories import (
    SpanKind,
    StopReason,
    ToolCall,
    Trajectory,
    TranscriptMessage,
    TurnSpan,
    validate_trajectory,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protocol.environments import EnvironmentConfig
    from worker.environments.sandbox import ToolSandbox

FinishReason = Literal["stop", "length"]


class Generated(NamedTuple):
    """One engine call's output: the sampled tokens (EOS included when it stopped on one),
    their behaviour log-probs, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class TurnEngine(Protocol):
    """Samples a continuation of exactly `token_ids` (no template, no special tokens added)."""

    def generate(self, token_ids: Sequence[int], max_new_tokens: int) -> Generated: ...


class EngineContractError(RuntimeError):
    """The engine returned something a turn cannot be (no tokens, too many, misaligned)."""


class EnvironmentSetupError(ValueError):
    """An environment that cannot run here (limits above the engine's, missing tools)."""


class PromptTooLong(ValueError):
    """A prompt that leaves no room for a model turn within max_total_tokens."""


@dataclass
class ModelTurn:
    """A model turn as appended: its tokens, its text (EOS excluded) and how it ended."""

    token_ids: list[int]
    content: str
    finish_reason: FinishReason
    cut_by_budget: bool


class Conversation:
    """One trajectory under construction (tokens, mask, log-probs, spans, transcript)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_messages: Sequence[Mapping[str, Any]],
        *,
        max_total_tokens: int,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.max_total_tokens = max_total_tokens
        self.rendered: list[dict[str, Any]] = [dict(m) for m in prompt_messages]
        self.messages = [
            TranscriptMessage(role=str(m["role"]), content=str(m["content"]), kind="prompt")
            for m in prompt_messages
        ]
        self.token_ids: list[int] = []
        self.logprobs: list[float | None] = []
        self.spans: list[TurnSpan] = []
        self._append("prompt", prompt_ids(tokenizer, self.rendered, self.tools), None)
        if len(self.token_ids) >= max_total_tokens:
            raise PromptTooLong(
                f"the prompt has {len(self.token_ids)} tokens: no room for a model turn within "
                f"max_total_tokens {max_total_tokens}"
            )
        self._ending = ""

    @property
    def room(self) -> int:
        return self.max_total_tokens - len(self.token_ids)

    def _append(self, kind: SpanKind, ids: list[int], logprobs: list[float] | None) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs if logprobs is not None else [None] * len(ids))
        self.spans.append(TurnSpan(kind=kind, start=start, end=len(self.token_ids)))

    def model_turn(self, engine: TurnEngine, max_new_tokens: int) -> ModelTurn:
        """Ask the engine for the next turn (at most the room left) and append it."""
        limit = min(max_new_tokens, self.room)
        out = engine.generate(list(self.token_ids), limit)
        ids, lps = [int(t) for t in out.token_ids], [float(x) for x in out.logprobs]
        if not ids or len(ids) > limit or len(lps) != len(ids):
            raise EngineContractError(
                f"the engine returned {len(ids)} tokens and {len(lps)} log-probs for at most "
                f"{limit} new tokens"
            )
        self._append("model", ids, lps)
        stopped = out.finish_reason == "stop"
        self._ending = self._text(ids[-1:]) if stopped else ""
        content = self._text(ids[:-1] if stopped else ids)
        self.rendered.append({"role": "assistant", "content": content})
        return ModelTurn(ids, content, out.finish_reason, not stopped and limit < max_new_tokens)

    def _text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def record_model_message(self, content: str, calls: Sequence[ToolCall] = ()) -> None:
        self.messages.append(
            TranscriptMessage(role="assistant", content=content, kind="model", tool_calls=calls)
        )

    def append_environment(self, messages: Sequence[TranscriptMessage]) -> bool:
        """Append an environment turn after the last model turn; False (nothing appended) when
        it would leave no room for another model turn within max_total_tokens."""
        rendered = [_rendered(m) for m in messages]
        text = environment_segment(
            self.tokenizer, self.rendered[:-1], rendered, self._ending, self.tools
        )
        ids = encode_text(self.tokenizer, text)
        if len(ids) >= self.room:
            return False
        self._append("environment", ids, None)
        self.rendered.extend(rendered)
        self.messages.extend(messages)
        return True

    def finish(
        self,
        stop_reason: StopReason,
        *,
        tool_calls: int = 0,
        tool_errors: int = 0,
        info: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        trajectory = Trajectory(
            token_ids=self.token_ids,
            loss_mask=[1 if lp is not None else 0 for lp in self.logprobs],
            logprobs=self.logprobs,
            spans=self.spans,
            messages=self.messages,
            stop_reason=stop_reason,
            tool_calls=tool_calls,
            tool_errors=tool_errors,
            info=dict(info or {}),
        )
        validate_trajectory(trajectory, self.max_total_tokens)
        return trajectory


def _rendered(message: TranscriptMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name is not None:
        out["name"] = message.name
    return out


def cut_reason(turn: ModelTurn) -> StopReason:
    """Why a turn that ended without EOS ends the rollout."""
    return "token_budget" if turn.cut_by_budget else "length"


class Environment(abc.ABC):
    """Runs rollouts of one run's environment on one worker. Built once per (run, engine)."""

    name: ClassVar[str]

    def __init__(
        self,
        config: EnvironmentConfig,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_model_len: int,
        sandbox: ToolSandbox | None = None,
    ) -> None:
        limit = config.max_total_tokens or max_model_len
        if limit > max_model_len:
            raise EnvironmentSetupError(
                f"max_total_tokens {limit} exceeds this engine's max_model_len {max_model_len}"
            )
        self.config = config
        self.tokenizer = tokenizer
        self.max_total_tokens = limit
        self.max_turns = config.turns
        self.sandbox = sandbox

    def start(
        self,
        prompt_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Conversation:
        return Conversation(
            self.tokenizer, prompt_messages, max_total_tokens=self.max_total_tokens, tools=tools
        )

    @abc.abstractmethod
    def rollout(
        self,
        engine: TurnEngine,
        prompt_messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int,
        seed: int = 0,
    ) -> Trajectory:
        """One trajectory from the prompt's messages (no reference columns). `max_new_tokens`
        bounds each model turn; `seed` makes the environment's own choices reproducible."""
