"""Tokenizer fingerprint: a stable sha256 over what decides how text becomes token ids.

Pure (no torch, no transformers): the caller passes the tokenizer's parts as plain data
(`lm.chat.tokenizer_fingerprint` extracts them from a Hugging Face tokenizer). Worker and
learner compute it the same way; the learner reports it on attach, leases carry it, and every
rollout batch is stamped with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FINGERPRINT_VERSION = 1


def _canonical(value: Any) -> Any:
    """Plain JSON data with deterministic ordering (mapping keys sorted by json.dumps)."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def tokenizer_fingerprint(
    vocab: Mapping[str, int],
    added_tokens: Iterable[Mapping[str, Any]],
    special_tokens: Mapping[str, Any],
    chat_template: str | Mapping[str, str] | None,
    merges: Sequence[str] | None = None,
) -> str:
    """sha256 hex digest (64 characters) of a tokenizer's identity.

    vocab: token string -> id (the full vocabulary, added tokens included or not).
    added_tokens: one mapping per added token, e.g. {"id": 2, "content": "<|im_end|>",
        "special": True}; order does not matter (sorted by id, then content).
    special_tokens: role -> token, e.g. {"eos_token": "<|im_end|>", "pad_token": ...}.
    chat_template: the Jinja template (or a name -> template mapping), or None.
    merges: BPE merges as "a b" strings, in order (they decide tokenization as much as the
        vocabulary does); None when the tokenizer has none.
    """
    added = sorted(
        (_canonical(dict(t)) for t in added_tokens),
        key=lambda t: (int(t.get("id", -1)), str(t.get("content", ""))),
    )
    payload = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "vocab": sorted(([tok, int(i)] for tok, i in vocab.items()), key=lambda p: (p[1], p[0])),
        "added_tokens": added,
        "special_tokens": _canonical(dict(special_tokens)),
        "chat_template": _canonical(chat_template),
        "merges": None if merges is None else [str(m) for m in merges],
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
