"""The run config as a tracker may see it: secret-looking fields and values replaced.

A field is secret when a part of its name (split at `_`, `-`, `.` and case changes) is one of
SECRET_PARTS (webhook_url, api_key, headers, token, authorization, …: `max_new_tokens` is
not). A string is secret when it looks like a key or bearer token (protocol/rewards_judge.py's
KEY_LIKE at its start, or anywhere in it an asyncgrpo token `agr_…`, an AWS access key id
`AKIA…`/`ASIA…`, or an `sk-…`/`hf_…`/`ghp_…`-style key of 16+ characters); a URL keeps its
scheme, host and path, and loses its user:password and its query (protocol/outbound.py
`redacted_url`, the rule the server's API answers follow too)."""

from __future__ import annotations

import re
from typing import Any

from protocol.outbound import REDACTED, redacted_url
from protocol.rewards_judge import KEY_LIKE

SECRET_PARTS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "bearer",
        "cookie",
        "cookies",
        "credential",
        "credentials",
        "header",
        "headers",
        "key",
        "passwd",
        "password",
        "secret",
        "signature",
        "token",
        "webhook",
    }
)
_PARTS = re.compile(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])")
# anywhere in the string: an asyncgrpo token, an AWS access key id, a key-like word
_TOKEN = re.compile(
    r"\bagr_[a-z]+_|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\b(?:sk|pk|rk)[-_][A-Za-z0-9_-]{16,}"
    r"|\b(?:hf|gh[pousr])_[A-Za-z0-9]{16,}"
)


def secret_key(name: str) -> bool:
    """Whether a field of this name holds a secret (by the parts of its name)."""
    parts = {p.lower() for p in _PARTS.split(name) if p}
    return bool(parts & SECRET_PARTS) or "apikey" in name.lower().replace("_", "")


def redact_text(text: str) -> str:
    """A secret-looking string replaced; a URL without its credentials and query."""
    stripped = text.strip()
    if KEY_LIKE.search(stripped) or _TOKEN.search(stripped):
        return REDACTED
    if "://" in stripped:
        return redacted_url(stripped)
    return text


def redact(value: Any) -> Any:
    """A JSON-like value with every secret field and secret-looking string redacted."""
    if isinstance(value, dict):
        return {
            str(k): REDACTED if secret_key(str(k)) and v is not None else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
