"""A small environment written with the real `verifiers` package (0.3.x MultiTurnEnv), for the
adapter test that runs when the `verifiers` extra is installed: the model answers, the
environment asks it to say the word again (2 turns); the rubric scores 1.0 when it repeats."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


class RepeatEnv(vf.MultiTurnEnv):
    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        return [{"role": "user", "content": "Say the word again."}]


async def repeated(completion: Any, **kwargs: Any) -> float:
    said = [m["content"].strip() for m in completion if m["role"] == "assistant"]
    return 1.0 if len(said) == 2 and said[0] == said[1] else 0.0


def load_environment(**kwargs: Any) -> RepeatEnv:
    rows = Dataset.from_list([{"question": "Say one word.", "answer": ""}])
    return RepeatEnv(dataset=rows, rubric=vf.Rubric(funcs=[repeated]), max_turns=2, **kwargs)
