"""lm.chat on the real tokenizer: templating, tokenization and the tokenizer fingerprint."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from transformers import AutoTokenizer

from lm.chat import chat_messages, encode_prompt, tokenizer_fingerprint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SYSTEM = "You are a helpful assistant."


def _reference_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


def test_string_prompt_gets_the_run_system_message(small_tokenizer: Any) -> None:
    ids = encode_prompt(small_tokenizer, "What is 7+5?", SYSTEM)
    assert ids == encode_prompt(small_tokenizer, "What is 7+5?", SYSTEM)  # deterministic
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 7+5?"}]
    assert ids == _reference_ids(small_tokenizer, messages)
    text = small_tokenizer.decode(ids)
    assert SYSTEM in text and "SmolLM" not in text  # the template's default line is replaced
    assert text.endswith("<|im_start|>assistant\n")
    bos = small_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == bos and ids[1] != bos  # no special token added twice


def test_chat_messages_are_used_as_given(small_tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "2+2?"},
    ]
    assert chat_messages(messages, SYSTEM) == messages
    ids = encode_prompt(small_tokenizer, messages, SYSTEM)
    assert ids == _reference_ids(small_tokenizer, messages)


def test_no_system_message_keeps_the_template_default(small_tokenizer: Any) -> None:
    ids = encode_prompt(small_tokenizer, "Hi", None)
    assert ids == _reference_ids(small_tokenizer, [{"role": "user", "content": "Hi"}])


def test_fingerprint_stable_across_loads_and_sensitive_to_the_template(
    small_model_dir: str, small_tokenizer: Any
) -> None:
    again = AutoTokenizer.from_pretrained(small_model_dir)
    fp = tokenizer_fingerprint(small_tokenizer)
    assert len(fp) == 64
    assert tokenizer_fingerprint(again) == fp
    again.chat_template = again.chat_template.replace("assistant", "bot")
    assert tokenizer_fingerprint(again) != fp
    third = copy.deepcopy(small_tokenizer)
    third.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    assert tokenizer_fingerprint(third) != fp
