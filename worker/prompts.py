"""Lease prompts → token ids, and this worker's tokenizer fingerprint, both through lm/chat.py
(the one home of chat templating shared with the learner; nothing is re-implemented here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protocol.schemas import LeasePrompt


def plain_prompt(prompt: Any) -> str | list[dict[str, str]]:
    """A lease prompt as lm.chat takes it: text, or messages as dicts."""
    if isinstance(prompt, str):
        return prompt
    return [m if isinstance(m, dict) else m.model_dump() for m in prompt]


class PromptEncoder:
    """Encodes a lease's prompts with the model's chat template (lm.chat)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def encode(self, prompts: Sequence[LeasePrompt], system_prompt: str | None) -> list[list[int]]:
        from lm.chat import encode_prompt

        return [
            list(encode_prompt(self.tokenizer, plain_prompt(p.prompt), system_prompt))
            for p in prompts
        ]

    def fingerprint(self) -> str:
        from lm.chat import tokenizer_fingerprint

        return str(tokenizer_fingerprint(self.tokenizer))
