"""`single_turn`: one generation per prompt, the behaviour of every run before environments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol.trajectories import Trajectory
from worker.environments.base import Environment, TurnEngine, cut_reason


class SingleTurnEnvironment(Environment):
    name = "single_turn"

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
        return chat.finish("done" if turn.finish_reason == "stop" else cut_reason(turn))
