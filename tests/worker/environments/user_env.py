"""A user environment for the allowlist tests: answers every model turn with "again" once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol.trajectories import Trajectory, TranscriptMessage
from worker.environments.base import Environment, TurnEngine

LOADED = True


class EchoTwice(Environment):
    name = "echo_twice"

    def rollout(
        self,
        engine: TurnEngine,
        prompt_messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int,
        seed: int = 0,
    ) -> Trajectory:
        chat = self.start(prompt_messages)
        turn = chat.model_turn(engine, max_new_tokens)
        chat.record_model_message(turn.content)
        chat.append_environment([TranscriptMessage(role="user", content="again", kind="feedback")])
        turn = chat.model_turn(engine, max_new_tokens)
        chat.record_model_message(turn.content)
        return chat.finish("done")


NOT_AN_ENVIRONMENT = object()
