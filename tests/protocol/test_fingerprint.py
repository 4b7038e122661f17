"""protocol.fingerprint: stable, order-insensitive where order carries no meaning, and sensitive
to everything that changes tokenization or templating."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.fingerprint import tokenizer_fingerprint


def _parts() -> dict[str, Any]:
    return {
        "vocab": {"a": 0, "b": 1, "ab": 2, "<eos>": 3},
        "added_tokens": [
            {"id": 3, "content": "<eos>", "special": True},
            {"id": 4, "content": "<pad>", "special": True},
        ],
        "special_tokens": {"eos_token": "<eos>", "pad_token": "<pad>"},
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "merges": ["a b"],
    }


def test_is_sha256_hex_and_stable() -> None:
    fp = tokenizer_fingerprint(**_parts())
    assert len(fp) == 64
    int(fp, 16)
    assert tokenizer_fingerprint(**_parts()) == fp


def test_dict_and_added_token_order_do_not_matter() -> None:
    parts = _parts()
    shuffled = dict(parts)
    shuffled["vocab"] = dict(reversed(list(parts["vocab"].items())))
    shuffled["added_tokens"] = list(reversed(parts["added_tokens"]))
    shuffled["special_tokens"] = dict(reversed(list(parts["special_tokens"].items())))
    assert tokenizer_fingerprint(**shuffled) == tokenizer_fingerprint(**parts)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("vocab", {"a": 0, "b": 1, "ab": 2, "<eos>": 5}),
        ("vocab", {"a": 0, "b": 1, "ba": 2, "<eos>": 3}),
        ("added_tokens", [{"id": 3, "content": "<eos>", "special": False}]),
        ("special_tokens", {"eos_token": "<pad>", "pad_token": "<pad>"}),
        ("chat_template", "{{ messages[0]['content'] }}"),
        ("chat_template", None),
        ("merges", ["b a"]),
        ("merges", None),
    ],
)
def test_any_change_changes_it(key: str, value: Any) -> None:
    parts = _parts()
    changed = {**parts, key: value}
    assert tokenizer_fingerprint(**changed) != tokenizer_fingerprint(**parts)
