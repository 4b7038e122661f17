"""A STAND-IN for a `verifiers` environment module, written for the adapter tests.

It is NOT the verifiers package: it follows the classic (v0.1) documented interface of a
verifiers `MultiTurnEnv` as the adapter relies on it: `load_environment(**kwargs)` returns an
environment whose async `rollout(client, model, prompt, answer=…, info=…, sampling_args=…)`
calls `await client.chat.completions.create(model=…, messages=…, **sampling_args)` once per
turn, asks `env_response(messages, state)` for the environment's reply between turns and
returns `(completion, state)`; its `rubric.score_rollout(prompt=…, completion=…, answer=…,
state=…, info=…)` (async) returns an object with `reward`.

The game: the model answers, the environment asks it to "Say the word again." (2 turns); the
rubric scores 1.0 when the second answer repeats the first, else 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOADED = True


@dataclass
class RolloutScore:
    reward: float


class RepeatRubric:
    async def score_rollout(
        self, *, prompt: Any, completion: Any, answer: str, state: Any, info: Any
    ) -> RolloutScore:
        said = [m["content"].strip() for m in completion if m["role"] == "assistant"]
        return RolloutScore(1.0 if len(said) == 2 and said[0] == said[1] else 0.0)


class RepeatEnv:
    """A two-turn MultiTurnEnv-shaped environment."""

    def __init__(self, max_turns: int = 2, rewrite_history: bool = False) -> None:
        self.max_turns = max_turns
        self.rewrite_history = rewrite_history
        self.rubric = RepeatRubric()

    async def env_response(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> Any:
        return [{"role": "user", "content": "Say the word again."}], state

    async def rollout(
        self,
        client: Any,
        model: str,
        prompt: list[dict[str, Any]],
        answer: str = "",
        info: dict[str, Any] | None = None,
        sampling_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        messages = list(prompt)
        state: dict[str, Any] = {"turn": 0, "responses": []}
        completion: list[dict[str, Any]] = []
        while state["turn"] < self.max_turns:
            if state["turn"] > 0:
                reply, state = await self.env_response(messages, state)
                messages += reply
                completion += reply
                if self.rewrite_history:
                    messages[0] = {**messages[0], "content": messages[0]["content"] + "!"}
            response = await client.chat.completions.create(
                model=model, messages=messages, **(sampling_args or {})
            )
            said = {"role": "assistant", "content": response.choices[0].message.content}
            messages.append(said)
            completion.append(said)
            state["responses"].append(response)
            state["turn"] += 1
        return completion, state


def load_environment(**kwargs: Any) -> RepeatEnv:
    return RepeatEnv(**kwargs)
