"""`verifiers:<module>`: a `verifiers` environment (the library prime-rl uses) run on the worker.

The module (allowed by the worker's operator, see protocol.environments) is imported and its
`load_environment(**kwargs)` builds the environment, as `verifiers.load_environment` does.
verifiers 0.3.x's `MultiTurnEnv.rollout(input, client, model, sampling_args) -> State` gets a
verifiers `Client` (worker/environments/verifiers_state.py); the classic
`rollout(client, model, prompt, answer=…, info=…, sampling_args=…) -> (completion, state)` gets
`InProcessClient`, an OpenAI-compatible client whose `chat.completions.create` is a model turn.
Both run on the worker's own `TurnEngine` in process (no network port).

Tokens stay exact: the first call's messages are the prompt, rendered once by the chat
template; every later call must repeat the conversation so far unchanged (the assistant
messages as this client returned them) and may add environment messages after it, which are
appended with `Conversation.append_environment` like the built-in environments' turns. A call
that rewrites the history is refused (`VerifiersProtocolError`), never re-rendered.

Rewards stay on the learner. Only when the run requires trusted workers and the environment has
a rubric, the worker scores the rollout and records it in `info["worker_score"]` (the learner
uses it only for such runs: the `worker_score` reward).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from protocol.environments import verifiers_module
from protocol.trajectories import StopReason, Trajectory, TranscriptMessage
from worker.environments.base import (
    Conversation,
    Environment,
    EnvironmentSetupError,
    TurnEngine,
    cut_reason,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protocol.environments import EnvironmentConfig
    from worker.environments.sandbox import ToolSandbox

WORKER_SCORE = "worker_score"
_MODEL = "asyncgrpo-worker"


class VerifiersProtocolError(RuntimeError):
    """The verifiers environment called the client in a way a token-exact trajectory cannot
    follow (history rewritten, several choices, no messages)."""


class _RolloutEnded(Exception):
    """Raised inside `create` to end the verifiers rollout (max_turns, token budget)."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Session:
    """One rollout's conversation behind the client."""

    env: VerifiersEnvironment
    engine: TurnEngine
    max_new_tokens: int
    chat: Conversation | None = None
    turns: int = 0
    last_cut: StopReason | None = None
    failure: Exception | None = None

    def create(self, messages: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        content, finish = self.turn(messages, kwargs)
        return _completion(content, finish, self.turns)

    def turn(self, messages: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
        """One model turn after `messages`: (its text, finish reason). Errors are kept on the
        session too, so that a library that catches them cannot hide them."""
        try:
            return self._turn(messages, kwargs)
        except (_RolloutEnded, VerifiersProtocolError) as exc:
            self.failure = exc
            raise

    def _turn(self, messages: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
        if kwargs.get("n", 1) != 1:
            raise VerifiersProtocolError("the in-process client samples one choice (n=1)")
        plain = [_plain(m) for m in messages]
        if self.chat is None:
            self.chat = self.env.start(plain)
        else:
            self._append_environment(plain)
        if self.turns >= self.env.max_turns:
            raise _RolloutEnded("max_turns")
        limit = _max_tokens(kwargs, self.max_new_tokens)
        turn = self.chat.model_turn(self.engine, limit)
        self.chat.record_model_message(turn.content)
        self.turns += 1
        self.last_cut = cut_reason(turn) if turn.finish_reason == "length" else None
        return turn.content, turn.finish_reason

    def _append_environment(self, messages: list[dict[str, str]]) -> None:
        assert self.chat is not None
        known = self.chat.rendered
        if messages[: len(known)] != [_plain(m) for m in known]:
            raise VerifiersProtocolError(
                "the environment changed the conversation it sent before (a token-exact "
                "trajectory appends environment messages only after the last model turn)"
            )
        new = messages[len(known) :]
        if not new:
            raise VerifiersProtocolError("a model turn must follow environment messages")
        if any(m["role"] == "assistant" for m in new):
            raise VerifiersProtocolError("environment messages cannot be assistant messages")
        if not self.chat.append_environment([_transcript(m) for m in new]):
            raise _RolloutEnded("token_budget")


def _plain(message: Any) -> dict[str, str]:
    """Role and text of a message given as a dict or as a verifiers message object."""
    get = message.get if isinstance(message, Mapping) else lambda k: getattr(message, k, None)
    content = get("content")
    if not isinstance(content, str):
        raise VerifiersProtocolError(
            f"message content must be text (got {type(content).__name__}); tool calls and "
            "multimodal content are not supported by the in-process client"
        )
    return {"role": str(get("role")), "content": content}


def _transcript(message: Mapping[str, str]) -> TranscriptMessage:
    kind = "tool_result" if message["role"] == "tool" else "feedback"
    return TranscriptMessage(role=message["role"], content=message["content"], kind=kind)


def _max_tokens(kwargs: Mapping[str, Any], default: int) -> int:
    asked = kwargs.get("max_completion_tokens") or kwargs.get("max_tokens")
    return min(int(asked), default) if asked else default


def _completion(content: str, finish_reason: str, turn: int) -> Any:
    """A ChatCompletion-shaped answer (the fields verifiers reads)."""
    message = SimpleNamespace(role="assistant", content=content, tool_calls=None)
    choice = SimpleNamespace(index=0, message=message, finish_reason=finish_reason)
    return SimpleNamespace(id=f"asyncgrpo-{turn}", model=_MODEL, choices=[choice])


class _ChatCompletions:
    def __init__(self, session: _Session) -> None:
        self._session = session

    async def create(
        self, *, messages: Sequence[Mapping[str, Any]], model: str = _MODEL, **kwargs: Any
    ) -> Any:
        return self._session.create(messages, kwargs)


class InProcessClient:
    """The OpenAI client surface verifiers calls (`client.chat.completions.create`, async),
    backed by one rollout's engine. `completions.create` (raw text prompts) is absent on
    purpose: a text prompt would be re-tokenized, not token-exact."""

    def __init__(self, session: _Session) -> None:
        self.chat = SimpleNamespace(completions=_ChatCompletions(session))


def load_verifiers_environment(name: str, kwargs: Mapping[str, Any]) -> Any:
    """Import the allowed module of `verifiers:<module>` and call its load_environment."""
    module_name = verifiers_module(name)
    if module_name is None:
        raise EnvironmentSetupError(f"{name!r} does not name a verifiers environment module")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentSetupError(f"cannot import {module_name!r}: {exc}") from exc
    load = getattr(module, "load_environment", None)
    if not callable(load):
        raise EnvironmentSetupError(f"module {module_name!r} has no load_environment()")
    try:
        return load(**kwargs)
    except (TypeError, ValueError) as exc:
        raise EnvironmentSetupError(f"{module_name}.load_environment failed: {exc}") from exc


class VerifiersEnvironment(Environment):
    name = "verifiers"

    def __init__(
        self,
        config: EnvironmentConfig,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_model_len: int,
        sandbox: ToolSandbox | None = None,
    ) -> None:
        super().__init__(config, tokenizer, max_model_len=max_model_len, sandbox=sandbox)
        self.vf_env = load_verifiers_environment(config.name, config.kwargs)
        self.scores_on_worker = config.requires_trusted_worker and (
            getattr(self.vf_env, "rubric", None) is not None
        )
        # verifiers 0.3.x: rollout(input, client, model, sampling_args) -> State
        self.state_api = next(iter(inspect.signature(self.vf_env.rollout).parameters)) == "input"

    def rollout(
        self,
        engine: TurnEngine,
        prompt_messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int,
        seed: int = 0,
    ) -> Trajectory:
        session = _Session(self, engine, max_new_tokens)
        return asyncio.run(self._rollout(session, [_plain(m) for m in prompt_messages], seed))

    async def _rollout(
        self, session: _Session, prompt: list[dict[str, str]], seed: int
    ) -> Trajectory:
        completion: Any = None
        state: Any = None
        info: dict[str, Any] = {"seed": seed}
        try:
            if self.state_api:
                from worker.environments.verifiers_state import engine_client, rollout_state

                state = await rollout_state(self.vf_env, engine_client(session.turn), prompt, seed)
            else:
                completion, state = await self.vf_env.rollout(
                    InProcessClient(session), _MODEL, prompt, answer="", info=info, sampling_args={}
                )
        except _RolloutEnded:
            pass
        if isinstance(session.failure, VerifiersProtocolError):
            raise session.failure
        if session.chat is None:
            raise VerifiersProtocolError("the verifiers environment never called the model")
        ended = session.failure.reason if isinstance(session.failure, _RolloutEnded) else None
        out: dict[str, Any] = {}
        if self.scores_on_worker and ended is None:
            out[WORKER_SCORE] = await self._score(prompt, completion, state, info)
        return session.chat.finish(ended or session.last_cut or "done", info=out)

    async def _score(self, prompt: Any, completion: Any, state: Any, info: Any) -> float:
        if self.state_api:
            from worker.environments.verifiers_state import score_state

            reward = await score_state(self.vf_env, state)
        else:
            scored = await self.vf_env.rubric.score_rollout(
                prompt=prompt, completion=completion, answer="", state=state, info=info
            )
            reward = float(scored.reward)
        if not math.isfinite(reward):
            raise VerifiersProtocolError(f"the rubric returned a non-finite score {reward}")
        return reward
