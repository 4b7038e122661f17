"""Chat templating and tokenization shared by worker and learner (docs/architecture/loss.md,
"Sampling").

A prompt is a string (it gets the run's system message, then becomes the user turn) or a list
of chat messages (used as given). The chat template is applied as text with the generation
prompt, then tokenized with `add_special_tokens=False`, so no BOS is added twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from protocol import fingerprint as _fp

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Prompt = str | Sequence[Mapping[str, str]]


def chat_messages(prompt: Prompt, system_prompt: str | None) -> list[dict[str, str]]:
    """The messages of a prompt: a string becomes [system?, user]; messages pass unchanged."""
    if isinstance(prompt, str):
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return [*messages, {"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, system_prompt: str | None
) -> str:
    """The prompt as text after the chat template, ending with the assistant's turn header."""
    text = tokenizer.apply_chat_template(
        chat_messages(prompt, system_prompt), tokenize=False, add_generation_prompt=True
    )
    return str(text)


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, system_prompt: str | None
) -> list[int]:
    """Token ids of a prompt, exactly as worker and learner both feed them to the model."""
    text = render_prompt(tokenizer, prompt, system_prompt)
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _merges(tokenizer: PreTrainedTokenizerBase) -> list[str] | None:
    """BPE merges as "a b" strings (tokenizers writes pairs or strings depending on version)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    model = json.loads(backend.to_str()).get("model", {})
    merges = model.get("merges")
    if merges is None:
        return None
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def tokenizer_parts(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The tokenizer's identity as plain data (see protocol.fingerprint)."""
    added = [
        {
            "id": int(i),
            "content": t.content,
            "special": bool(t.special),
            "lstrip": bool(t.lstrip),
            "rstrip": bool(t.rstrip),
            "normalized": bool(t.normalized),
            "single_word": bool(t.single_word),
        }
        for i, t in tokenizer.added_tokens_decoder.items()
    ]
    special = {k: str(v) for k, v in tokenizer.special_tokens_map.items()}
    return {
        "vocab": tokenizer.get_vocab(),
        "added_tokens": added,
        "special_tokens": special,
        "chat_template": tokenizer.chat_template,
        "merges": _merges(tokenizer),
    }


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 over vocabulary, BPE merges, added/special tokens and chat template."""
    return _fp.tokenizer_fingerprint(**tokenizer_parts(tokenizer))
